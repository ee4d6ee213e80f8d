//! The key/value cache, owned by the engine: one [`SequenceCache`] per sequence, never
//! inside a model. Keys and values are stored as f16, as llama.cpp stores them by default:
//! half the memory, and the same rounding as the reference implementation.

use half::f16;

/// Cached keys and values of one layer of one sequence, laid out `[position][kv head][dim]`.
#[derive(Debug, Default, Clone)]
pub struct LayerCache {
    /// Keys, `kv_width` values per position.
    pub keys: Vec<f16>,
    /// Values, `kv_width` values per position.
    pub values: Vec<f16>,
}

/// The cache of one sequence: every layer's keys and values for positions `0..len()`.
#[derive(Debug, Clone)]
pub struct SequenceCache {
    layers: Vec<LayerCache>,
    kv_width: usize,
    len: usize,
}

impl SequenceCache {
    /// An empty cache for a model with `n_layers` layers and `kv_width` (= kv heads × head
    /// size) floats per position per layer, with room reserved for `capacity` positions.
    pub fn new(n_layers: usize, kv_width: usize, capacity: usize) -> Self {
        let layer = LayerCache {
            keys: Vec::with_capacity(capacity * kv_width),
            values: Vec::with_capacity(capacity * kv_width),
        };
        Self {
            layers: vec![layer; n_layers],
            kv_width,
            len: 0,
        }
    }

    /// Number of positions whose keys and values are stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Floats per position per layer.
    pub fn kv_width(&self) -> usize {
        self.kv_width
    }

    /// One layer's storage.
    pub fn layer_mut(&mut self, layer: usize) -> &mut LayerCache {
        &mut self.layers[layer]
    }

    /// Marks `n` more positions as stored once every layer has appended them.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self
            .layers
            .iter()
            .all(|l| l.keys.len() == self.len * self.kv_width && l.values.len() == l.keys.len()));
    }

    /// Bytes held by this cache.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.keys.capacity() + l.values.capacity()) * 2)
            .sum()
    }
}
