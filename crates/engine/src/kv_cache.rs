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

    /// Forgets every position from `len` on (rejected draft tokens).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for layer in &mut self.layers {
            layer.keys.truncate(len * self.kv_width);
            layer.values.truncate(len * self.kv_width);
        }
        self.len = len;
    }

    /// A copy of this cache's first `len` positions with room for `capacity` positions.
    pub fn fork_prefix(&self, len: usize, capacity: usize) -> Self {
        let len = len.min(self.len);
        let room = capacity.max(len) * self.kv_width;
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let mut keys = Vec::with_capacity(room);
                keys.extend_from_slice(&l.keys[..len * self.kv_width]);
                let mut values = Vec::with_capacity(room);
                values.extend_from_slice(&l.values[..len * self.kv_width]);
                LayerCache { keys, values }
            })
            .collect();
        Self {
            layers,
            kv_width: self.kv_width,
            len,
        }
    }

    /// A copy of this cache with room reserved for `capacity` positions: a sequence
    /// that shares this one's prefix starts from it instead of recomputing it.
    pub fn fork(&self, capacity: usize) -> Self {
        self.fork_prefix(self.len, capacity)
    }

    /// Bytes held by this cache.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.keys.capacity() + l.values.capacity()) * 2)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(n: usize) -> SequenceCache {
        let mut c = SequenceCache::new(2, 3, 8);
        for l in 0..2 {
            let layer = c.layer_mut(l);
            layer
                .keys
                .extend((0..n * 3).map(|i| f16::from_f32(i as f32)));
            layer
                .values
                .extend((0..n * 3).map(|i| f16::from_f32(-(i as f32))));
        }
        c.commit(n);
        c
    }

    #[test]
    fn truncate_forgets_the_tail() {
        let mut c = filled(4);
        c.truncate(2);
        assert_eq!(c.len(), 2);
        assert_eq!(c.layer_mut(1).keys.len(), 6);
        c.truncate(5);
        assert_eq!(c.len(), 2, "truncating past the end changes nothing");
    }

    #[test]
    fn a_fork_has_the_same_content_and_its_own_room() {
        let c = filled(3);
        let mut f = c.fork(10);
        assert_eq!(f.len(), 3);
        assert!(f.layer_mut(0).keys.capacity() >= 30);
        assert_eq!(f.layer_mut(0).keys, filled(3).layer_mut(0).keys);
    }
}
