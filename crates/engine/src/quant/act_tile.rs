//! Prompt activations laid out for the 512-bit block-of-32 prompt kernel: up to
//! [`TILE_ROWS`] quantized rows, block by block, in exactly the vectors the kernel feeds
//! to its instructions, so that it loads each one as an operand instead of assembling it
//! again for every pair of weight rows.
//!
//! Per block, for each pair of rows (the last row twice when their number is odd): one
//! 64-byte line with the pair's 32 + 32 values as unsigned bytes `y + 128`, and one with
//! the pair's scales, each eight times, as `f32`; then one line with every row's `s`
//! (Q4_1's minimum terms), zero past the last row. The values and scales are those of the
//! [`Q8Row`]s, only moved, so nothing about a product's arithmetic changes.

use super::q8::Q8Row;

/// Most activation rows in one tile (two per 512-bit vector, eight pairs).
pub const TILE_ROWS: usize = 16;

/// 64 bytes aligned as a 512-bit vector.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Line(pub [u8; 64]);

/// Up to [`TILE_ROWS`] activation rows in the prompt kernel's order (see the module).
pub struct ActTile {
    rows: usize,
    blocks: usize,
    lines: Vec<Line>,
}

impl ActTile {
    /// The tile of `rows` (1 to [`TILE_ROWS`] of them), each at least `blocks` blocks.
    pub fn new(rows: &[&Q8Row], blocks: usize) -> Self {
        assert!((1..=TILE_ROWS).contains(&rows.len()));
        let pairs = rows.len().div_ceil(2);
        let mut lines = vec![Line([0; 64]); blocks * (2 * pairs + 1)];
        for (b, block) in lines.chunks_exact_mut(2 * pairs + 1).enumerate() {
            for p in 0..pairs {
                let pair = [2 * p, (2 * p + 1).min(rows.len() - 1)].map(|r| rows[r]);
                for (half, row) in pair.iter().enumerate() {
                    let values = &row.qs[b * 32..(b + 1) * 32];
                    for (out, &y) in block[2 * p].0[half * 32..].iter_mut().zip(values) {
                        *out = (y as u8) ^ 0x80;
                    }
                    let scale = row.d[b].to_le_bytes();
                    for lane in block[2 * p + 1].0[half * 32..][..32].chunks_exact_mut(4) {
                        lane.copy_from_slice(&scale);
                    }
                }
            }
            let sums = &mut block[2 * pairs].0;
            for (lane, row) in sums.chunks_exact_mut(4).zip(rows) {
                lane.copy_from_slice(&row.s[b].to_le_bytes());
            }
        }
        Self {
            rows: rows.len(),
            blocks,
            lines,
        }
    }

    /// Activation rows in the tile.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Pairs of rows (the last one possibly a row twice).
    pub fn pairs(&self) -> usize {
        self.rows.div_ceil(2)
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// The lines, block after block (see the module).
    pub fn lines(&self) -> &[Line] {
        &self.lines
    }

    /// Row `k` as a [`Q8Row`] again (for the portable path and tests).
    pub fn row(&self, k: usize) -> Q8Row {
        assert!(k < self.rows);
        let (p, half) = (k / 2, k % 2);
        let per_block = 2 * self.pairs() + 1;
        let mut row = Q8Row {
            d: Vec::with_capacity(self.blocks),
            s: Vec::with_capacity(self.blocks),
            qs: Vec::with_capacity(self.blocks * 32),
        };
        for block in self.lines.chunks_exact(per_block) {
            let values = &block[2 * p].0[half * 32..][..32];
            row.qs.extend(values.iter().map(|&y| (y ^ 0x80) as i8));
            let f32_at = |line: &Line, i: usize| {
                f32::from_le_bytes(line.0[4 * i..4 * i + 4].try_into().expect("four bytes"))
            };
            row.d.push(f32_at(&block[2 * p + 1], half * 8));
            row.s.push(f32_at(&block[2 * self.pairs()], k));
        }
        row
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;
    use crate::quant::sample::{self, Xorshift};

    #[test]
    fn every_row_comes_back_unchanged() {
        let mut rng = Xorshift::new(5);
        let cols = 32 * 5;
        for n in 1..=TILE_ROWS {
            let rows: Vec<Q8Row> = (0..n)
                .map(|_| quantize_row(&sample::activations(1, cols, 2.0, &mut rng)))
                .collect();
            let refs: Vec<&Q8Row> = rows.iter().collect();
            let tile = ActTile::new(&refs, cols / 32);
            assert_eq!(
                (tile.rows(), tile.pairs(), tile.blocks()),
                (n, n.div_ceil(2), 5)
            );
            for (k, want) in rows.iter().enumerate() {
                let got = tile.row(k);
                assert_eq!((&got.qs, &got.d, &got.s), (&want.qs, &want.d, &want.s));
            }
        }
    }
}
