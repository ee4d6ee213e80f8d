//! The key/value cache, owned by the engine: one [`SequenceCache`] per sequence, never
//! inside a model. Keys and values are stored as f16, as llama.cpp stores them by default:
//! half the memory, and the same rounding as the reference implementation.
//!
//! A sequence's cache is paged: fixed-size [`BLOCK_POSITIONS`]-position blocks, each holding
//! every layer's keys and values for its positions, reference-counted and shared read-only
//! between sequences that start the same way (the choices of one prompt with `n > 1` or
//! `best_of`, and prompts that start from the prefix cache). Forking a cache copies no keys;
//! a shared block is copied only when a sequence writes into it (its last, partly filled
//! block), and a block is freed when its last holder drops it.

use std::sync::Arc;

use half::f16;

/// Positions per block. A block's run of one layer's keys (or values) is what attention
/// reads in one stretch before it jumps to the next block: with 16 positions a decode step
/// at a 4,096-token context spent a quarter of its attention time waiting for each run's
/// first lines (`benches/attention_kernels.rs`, SmolLM2's shape: 15.6 against 11.8 ns per
/// head and key). The cost of larger blocks is memory: a sequence holds up to one block's
/// positions more than it uses, and the first write into a shared block copies it.
pub const BLOCK_POSITIONS: usize = 64;

/// Every layer's keys and values for [`BLOCK_POSITIONS`] positions, laid out
/// `[layer][keys, values][position][kv head][dim]`.
#[derive(Debug, Clone)]
struct Block {
    data: Box<[f16]>,
}

/// Where `layer`'s keys (`values` false) or values start within a block, for `kv_width`
/// floats per position.
fn layer_offset(layer: usize, values: bool, kv_width: usize) -> usize {
    (layer * 2 + values as usize) * BLOCK_POSITIONS * kv_width
}

/// The cache of one sequence: every layer's keys and values for positions `0..len()`.
#[derive(Debug, Clone)]
pub struct SequenceCache {
    blocks: Vec<Arc<Block>>,
    n_layers: usize,
    kv_width: usize,
    len: usize,
}

/// One layer's keys and values for positions `0..positions()` of a sequence.
#[derive(Debug, Clone, Copy)]
pub struct LayerView<'a> {
    blocks: &'a [Arc<Block>],
    layer: usize,
    kv_width: usize,
    positions: usize,
}

impl SequenceCache {
    /// An empty cache for a model with `n_layers` layers and `kv_width` (= kv heads × head
    /// size) floats per position per layer, expecting up to `capacity` positions (blocks
    /// are allocated as positions are written, not in advance).
    pub fn new(n_layers: usize, kv_width: usize, capacity: usize) -> Self {
        Self {
            blocks: Vec::with_capacity(capacity.div_ceil(BLOCK_POSITIONS)),
            n_layers,
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

    /// Stores `layer`'s keys and values (rounded to f16) for the positions after the
    /// committed ones: `keys` and `values` hold `n × kv_width` floats. Every layer writes
    /// the same `n` positions, then [`Self::commit`] marks them stored.
    pub fn write(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        assert!(layer < self.n_layers && keys.len() == values.len());
        let n = keys.len() / self.kv_width;
        let block_len = 2 * self.n_layers * BLOCK_POSITIONS * self.kv_width;
        while self.blocks.len() * BLOCK_POSITIONS < self.len + n {
            self.blocks.push(Arc::new(Block {
                data: vec![f16::ZERO; block_len].into_boxed_slice(),
            }));
        }
        let width = self.kv_width;
        let (key_at, value_at) = (
            layer_offset(layer, false, width),
            layer_offset(layer, true, width),
        );
        for i in 0..n {
            let pos = self.len + i;
            // A block shared with another sequence is copied before it is written.
            let block = Arc::make_mut(&mut self.blocks[pos / BLOCK_POSITIONS]);
            let slot = (pos % BLOCK_POSITIONS) * width;
            let rows = [(key_at, keys), (value_at, values)];
            for (at, src) in rows {
                let dst = &mut block.data[at + slot..at + slot + width];
                for (d, s) in dst.iter_mut().zip(&src[i * width..(i + 1) * width]) {
                    *d = f16::from_f32(*s);
                }
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
        assert!(layer < self.n_layers && positions <= self.blocks.len() * BLOCK_POSITIONS);
        LayerView {
            blocks: &self.blocks,
            layer,
            kv_width: self.kv_width,
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
            n_layers: self.n_layers,
            kv_width: self.kv_width,
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
        self.kv_width
    }

    /// The keys of position `pos` (every KV head).
    pub fn keys(&self, pos: usize) -> &'a [f16] {
        self.run(pos..pos + 1, false)
    }

    /// The values of position `pos` (every KV head).
    pub fn values(&self, pos: usize) -> &'a [f16] {
        self.run(pos..pos + 1, true)
    }

    /// The keys of positions `range`, which must lie within one block, contiguous:
    /// `range.len() × kv_width` values.
    pub fn key_run(&self, range: std::ops::Range<usize>) -> &'a [f16] {
        self.run(range, false)
    }

    /// The values of positions `range` within one block, as [`Self::key_run`].
    pub fn value_run(&self, range: std::ops::Range<usize>) -> &'a [f16] {
        self.run(range, true)
    }

    fn run(&self, range: std::ops::Range<usize>, values: bool) -> &'a [f16] {
        assert!(range.start < range.end && range.end <= self.positions);
        let block = range.start / BLOCK_POSITIONS;
        assert_eq!(
            block,
            (range.end - 1) / BLOCK_POSITIONS,
            "a run within one block"
        );
        let at = layer_offset(self.layer, values, self.kv_width)
            + (range.start % BLOCK_POSITIONS) * self.kv_width;
        let data: &'a [f16] = &self.blocks[block].data;
        &data[at..at + range.len() * self.kv_width]
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
