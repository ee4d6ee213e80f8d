//! The key/value cache, owned by the engine: one [`SequenceCache`] per sequence, never
//! inside a model. Keys and values are stored as f16 by default, as llama.cpp stores them:
//! half the memory, and the same rounding as the reference implementation; or, as
//! llama.cpp's `--cache-type-k` / `--cache-type-v` allow, in its Q8_0 or Q4_0 blocks
//! ([`KvType`]), each a type of its own for keys and values ([`KvTypes`]).
//!
//! A sequence's cache is paged: fixed-size [`BLOCK_POSITIONS`]-position blocks, each holding
//! every layer's keys and values for its positions, reference-counted and shared read-only
//! between sequences that start the same way (the choices of one prompt with `n > 1` or
//! `best_of`, and prompts that start from the prefix cache). Forking a cache copies no keys;
//! a shared block is copied only when a sequence writes into it (its last, partly filled
//! block), and a block is freed when its last holder drops it.

use std::sync::Arc;

use half::f16;

pub use crate::quant::kv::KvType;

/// Positions per block. A block's run of one layer's keys (or values) is what attention
/// reads in one stretch before it jumps to the next block: with 16 positions a decode step
/// at a 4,096-token context spent a quarter of its attention time waiting for each run's
/// first lines (`benches/attention_kernels.rs`, SmolLM2's shape: 15.6 against 11.8 ns per
/// head and key). The cost of larger blocks is memory: a sequence holds up to one block's
/// positions more than it uses, and the first write into a shared block copies it.
pub const BLOCK_POSITIONS: usize = 64;

/// The types a cache stores its keys and its values in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct KvTypes {
    /// The keys' type.
    pub keys: KvType,
    /// The values' type.
    pub values: KvType,
}

impl KvTypes {
    /// Both f16, the default.
    pub const F16: Self = Self {
        keys: KvType::F16,
        values: KvType::F16,
    };

    /// Whether both are f16.
    pub fn is_f16(self) -> bool {
        self == Self::F16
    }

    /// Bytes one position takes in a model of `n_layers` layers with `kv_width` key (and
    /// value) floats per layer.
    pub fn position_bytes(self, n_layers: usize, kv_width: usize) -> usize {
        n_layers * (self.keys.row_bytes(kv_width) + self.values.row_bytes(kv_width))
    }
}

/// Every layer's keys and values for [`BLOCK_POSITIONS`] positions, laid out
/// `[layer][keys, values][position][row]`, each row a position's every KV head in its
/// type. Held as f16 units, so that an f16 row is aligned; every part's size is even.
#[derive(Debug, Clone)]
struct Block {
    data: Box<[f16]>,
}

impl Block {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.data)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.data)
    }
}

/// The shape of a cache's rows: what a block holds and where.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    n_layers: usize,
    kv_width: usize,
    types: KvTypes,
}

impl Geometry {
    /// Bytes of one position's keys (`values` false) or values in one layer.
    fn row_bytes(self, values: bool) -> usize {
        let t = if values {
            self.types.values
        } else {
            self.types.keys
        };
        t.row_bytes(self.kv_width)
    }

    /// Where `layer`'s keys (`values` false) or values start within a block, in bytes.
    fn layer_offset(self, layer: usize, values: bool) -> usize {
        let (k, v) = (self.row_bytes(false), self.row_bytes(true));
        BLOCK_POSITIONS * (layer * (k + v) + if values { k } else { 0 })
    }

    /// Bytes of a block.
    fn block_bytes(self) -> usize {
        BLOCK_POSITIONS * self.types.position_bytes(self.n_layers, self.kv_width)
    }
}

/// The cache of one sequence: every layer's keys and values for positions `0..len()`.
#[derive(Debug, Clone)]
pub struct SequenceCache {
    blocks: Vec<Arc<Block>>,
    geometry: Geometry,
    len: usize,
}

/// One layer's keys and values for positions `0..positions()` of a sequence.
#[derive(Debug, Clone, Copy)]
pub struct LayerView<'a> {
    blocks: &'a [Arc<Block>],
    layer: usize,
    geometry: Geometry,
    positions: usize,
}

impl SequenceCache {
    /// An empty f16 cache for a model with `n_layers` layers and `kv_width` (= kv heads ×
    /// head size) floats per position per layer, expecting up to `capacity` positions
    /// (blocks are allocated as positions are written, not in advance).
    pub fn new(n_layers: usize, kv_width: usize, capacity: usize) -> Self {
        Self::with_types(n_layers, kv_width, capacity, KvTypes::F16)
    }

    /// [`Self::new`] storing keys and values in `types` (a quantized type needs
    /// `kv_width` to be a multiple of 32; heads must be too, which the model checks).
    pub fn with_types(n_layers: usize, kv_width: usize, capacity: usize, types: KvTypes) -> Self {
        assert!(types.keys.fits(kv_width) && types.values.fits(kv_width));
        Self {
            blocks: Vec::with_capacity(capacity.div_ceil(BLOCK_POSITIONS)),
            geometry: Geometry {
                n_layers,
                kv_width,
                types,
            },
            len: 0,
        }
    }

    /// The types keys and values are stored in.
    pub fn types(&self) -> KvTypes {
        self.geometry.types
    }

    /// Bytes of one block ([`BLOCK_POSITIONS`] positions of every layer).
    pub fn block_bytes(&self) -> usize {
        self.geometry.block_bytes()
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
        self.geometry.kv_width
    }

    /// Stores `layer`'s keys and values (rounded to f16, or quantized, as the cache's
    /// types say) for the positions after the committed ones: `keys` and `values` hold
    /// `n × kv_width` floats. Every layer writes the same `n` positions, then
    /// [`Self::commit`] marks them stored.
    pub fn write(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        let g = self.geometry;
        assert!(layer < g.n_layers && keys.len() == values.len());
        let width = g.kv_width;
        let n = keys.len() / width;
        let units = g.block_bytes() / 2;
        while self.blocks.len() * BLOCK_POSITIONS < self.len + n {
            self.blocks.push(Arc::new(Block {
                data: vec![f16::ZERO; units].into_boxed_slice(),
            }));
        }
        let parts = [
            (g.types.keys, g.layer_offset(layer, false), keys),
            (g.types.values, g.layer_offset(layer, true), values),
        ];
        for i in 0..n {
            let pos = self.len + i;
            // A block shared with another sequence is copied before it is written.
            let block = Arc::make_mut(&mut self.blocks[pos / BLOCK_POSITIONS]);
            for (t, at, src) in parts {
                let row = t.row_bytes(width);
                let at = at + (pos % BLOCK_POSITIONS) * row;
                t.write_row(
                    &src[i * width..(i + 1) * width],
                    &mut block.bytes_mut()[at..at + row],
                );
            }
        }
    }

    /// Marks `n` more positions as stored once every layer has written them.
    pub fn commit(&mut self, n: usize) {
        self.len += n;
        debug_assert!(self.blocks.len() * BLOCK_POSITIONS >= self.len);
    }

    /// `layer`'s keys and values for positions `0..positions` (committed ones and those
    /// written since).
    pub fn layer(&self, layer: usize, positions: usize) -> LayerView<'_> {
        assert!(layer < self.geometry.n_layers && positions <= self.blocks.len() * BLOCK_POSITIONS);
        LayerView {
            blocks: &self.blocks,
            layer,
            geometry: self.geometry,
            positions,
        }
    }

    /// Forgets every position from `len` on (rejected draft tokens).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        self.blocks.truncate(len.div_ceil(BLOCK_POSITIONS));
        self.len = len;
    }

    /// This cache's first `len` positions, sharing their blocks, expecting up to
    /// `capacity` positions.
    pub fn fork_prefix(&self, len: usize, capacity: usize) -> Self {
        let len = len.min(self.len);
        let mut blocks = Vec::with_capacity(capacity.max(len).div_ceil(BLOCK_POSITIONS));
        blocks.extend(self.blocks[..len.div_ceil(BLOCK_POSITIONS)].iter().cloned());
        Self {
            blocks,
            geometry: self.geometry,
            len,
        }
    }

    /// This cache, sharing its blocks, expecting up to `capacity` positions: a sequence
    /// that shares this one's prefix starts from it instead of recomputing it.
    pub fn fork(&self, capacity: usize) -> Self {
        self.fork_prefix(self.len, capacity)
    }

    /// Blocks this cache holds (some perhaps shared).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks this cache shares with other holders.
    pub fn shared_blocks(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| Arc::strong_count(b) > 1)
            .count()
    }
}

impl<'a> LayerView<'a> {
    /// Positions in view.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Floats per position.
    pub fn kv_width(&self) -> usize {
        self.geometry.kv_width
    }

    /// The types keys and values are stored in.
    pub fn types(&self) -> KvTypes {
        self.geometry.types
    }

    /// The keys of position `pos` (every KV head) of an f16 cache.
    pub fn keys(&self, pos: usize) -> &'a [f16] {
        self.key_run(pos..pos + 1)
    }

    /// The values of position `pos` (every KV head) of an f16 cache.
    pub fn values(&self, pos: usize) -> &'a [f16] {
        self.value_run(pos..pos + 1)
    }

    /// The f16 keys of positions `range`, which must lie within one block, contiguous:
    /// `range.len() × kv_width` values.
    pub fn key_run(&self, range: std::ops::Range<usize>) -> &'a [f16] {
        assert_eq!(self.geometry.types.keys, KvType::F16);
        bytemuck::cast_slice(self.bytes(range, false))
    }

    /// The f16 values of positions `range` within one block, as [`Self::key_run`].
    pub fn value_run(&self, range: std::ops::Range<usize>) -> &'a [f16] {
        assert_eq!(self.geometry.types.values, KvType::F16);
        bytemuck::cast_slice(self.bytes(range, true))
    }

    /// The stored key rows of positions `range` within one block, in the keys' type:
    /// `range.len()` rows of `types().keys.row_bytes(kv_width)` bytes.
    pub fn key_bytes(&self, range: std::ops::Range<usize>) -> &'a [u8] {
        self.bytes(range, false)
    }

    /// The stored value rows of positions `range` within one block, as [`Self::key_bytes`].
    pub fn value_bytes(&self, range: std::ops::Range<usize>) -> &'a [u8] {
        self.bytes(range, true)
    }

    fn bytes(&self, range: std::ops::Range<usize>, values: bool) -> &'a [u8] {
        assert!(range.start < range.end && range.end <= self.positions);
        let block = range.start / BLOCK_POSITIONS;
        assert_eq!(
            block,
            (range.end - 1) / BLOCK_POSITIONS,
            "a run within one block"
        );
        let row = self.geometry.row_bytes(values);
        let at =
            self.geometry.layer_offset(self.layer, values) + (range.start % BLOCK_POSITIONS) * row;
        let data: &'a [u8] = self.blocks[block].bytes();
        &data[at..at + range.len() * row]
    }

    /// Positions `range` split at block boundaries: each piece lies within one block.
    pub fn runs(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = std::ops::Range<usize>> {
        let end = range.end;
        let mut start = range.start;
        std::iter::from_fn(move || {
            if start >= end {
                return None;
            }
            let stop = ((start / BLOCK_POSITIONS + 1) * BLOCK_POSITIONS).min(end);
            let run = start..stop;
            start = stop;
            Some(run)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of `n` positions over 2 layers, 3 floats wide: keys `i`, values `-i` (plus
    /// 100 per layer).
    fn filled(n: usize) -> SequenceCache {
        let mut c = SequenceCache::new(2, 3, 8);
        for l in 0..2 {
            let keys: Vec<f32> = (0..n * 3).map(|i| (i + 100 * l) as f32).collect();
            let values: Vec<f32> = keys.iter().map(|k| -k).collect();
            c.write(l, &keys, &values);
        }
        c.commit(n);
        c
    }

    fn key(c: &SequenceCache, layer: usize, pos: usize) -> Vec<f32> {
        c.layer(layer, c.len())
            .keys(pos)
            .iter()
            .map(|k| k.to_f32())
            .collect()
    }

    /// Positions per block, shorter to write.
    const B: usize = BLOCK_POSITIONS;

    #[test]
    fn positions_read_back_across_blocks_and_layers() {
        let n = 2 * B + 8;
        let c = filled(n);
        assert_eq!(c.blocks(), 3);
        assert_eq!(key(&c, 0, 0), vec![0.0, 1.0, 2.0]);
        let p = B + 1;
        let k = (3 * p) as f32 + 100.0;
        assert_eq!(key(&c, 1, p), vec![k, k + 1.0, k + 2.0]);
        assert_eq!(
            c.layer(1, n).values(n - 1)[2].to_f32(),
            -(((n - 1) * 3) as f32 + 2.0 + 100.0)
        );
        let run = c.layer(0, n).key_run(B..B + 3);
        assert_eq!(run.len(), 9);
        assert_eq!(run[3].to_f32(), (3 * (B + 1)) as f32);
    }

    #[test]
    fn truncate_forgets_the_tail() {
        let mut c = filled(B + 4);
        c.truncate(2);
        assert_eq!((c.len(), c.blocks()), (2, 1));
        c.truncate(5);
        assert_eq!(c.len(), 2, "truncating past the end changes nothing");
    }

    #[test]
    fn forks_share_blocks_until_written() {
        let n = B + 4;
        let c = filled(n);
        let mut f = c.fork(2 * n);
        assert_eq!((f.len(), f.shared_blocks()), (n, 2));
        // Writing position n copies the partly filled second block, not the first.
        f.write(0, &[7.0; 3], &[7.0; 3]);
        f.write(1, &[8.0; 3], &[8.0; 3]);
        f.commit(1);
        assert_eq!(f.shared_blocks(), 1);
        assert_eq!(key(&f, 1, n), vec![8.0; 3]);
        assert_eq!(key(&f, 0, n - 1), key(&c, 0, n - 1));
        assert_eq!(c.len(), n, "the original is untouched");
        let p = c.fork_prefix(5, 10);
        assert_eq!((p.len(), p.blocks()), (5, 1));
    }
}
