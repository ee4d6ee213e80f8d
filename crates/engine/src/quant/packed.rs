//! Block-of-32 weights repacked eight rows at a time, so that one instruction converts the
//! eight rows' scales of a block and their quantized values sit side by side.
//!
//! For each group of eight rows (the last one padded with zero blocks) and each block
//! column, the eight rows' blocks are stored field by field: their f16 scales `d`, then
//! Q4_1's minimums `m` or Q5_0's high bits, then their quantized values. The layout does
//! not change any row's arithmetic: every (weight row, activation row) pair still takes one
//! fused multiply-add per block in eight lanes, then `hsum_float_8`, exactly as the
//! family's [`block32::dot`] does, so results are bit-identical to it.
//!
//! The layout and its kernels are generic over the format ([`Packed`], as llama.cpp's
//! repack templates are over the block type): what differs between the formats is how
//! many header bytes precede a block's values and how the kernels decode them.

#[cfg(target_arch = "x86_64")]
mod simd;

use std::ops::Range;

use super::act_tile::{ActTile, TILE_ROWS};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::__m256i;
use std::marker::PhantomData;

use super::formats::block32::{self, block_bytes, Block32};
use super::formats::{q4_0::Q4_0, q4_1::Q4_1, q5_0::Q5_0, q8_0::Q8_0};
use super::layout::Layout;
use super::output::Columns;
use super::q8::{self, Q8Row};
use super::{Activations, RowKernel, ACT_TILE, CHUNK};

/// Rows per group.
pub const GROUP: usize = 8;

/// A format this layout holds: where its values start in a block, and how the kernels
/// read a row's values from a block column (each format's impl below).
pub(in crate::quant) trait Packed: Block32 {
    /// Bytes of a block before its quantized values (scale, minimum, fifth bits).
    const HEADER: usize;
    /// Whether the kernels take its values as signed bytes: all but Q4_1's, whose
    /// unsigned nibbles go with its minimum (the kernels add `m · s_a` where this is
    /// false).
    const SIGNED: bool;

    /// Row `i`'s 32 values of a block column: signed bytes, or unsigned ones where
    /// [`Self::SIGNED`] is false.
    ///
    /// # Safety
    /// The CPU has AVX2; `column` is a block column of a group of this layout and
    /// `i < GROUP`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn column_values(column: *const u8, i: usize) -> __m256i;
}

impl Packed for Q4_0 {
    const HEADER: usize = 2;
    const SIGNED: bool = true;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn column_values(column: *const u8, i: usize) -> __m256i {
        // SAFETY: as the caller guarantees; the nibbles follow the eight scales.
        unsafe { crate::simd::int_lanes::nibbles_less_8(column.add(GROUP * 2 + i * 16)) }
    }
}

impl Packed for Q4_1 {
    const HEADER: usize = 4;
    const SIGNED: bool = false;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn column_values(column: *const u8, i: usize) -> __m256i {
        // SAFETY: as the caller guarantees; the nibbles follow the scales and minimums.
        unsafe { crate::simd::int_lanes::nibbles(column.add(GROUP * 4 + i * 16)) }
    }
}

impl Packed for Q5_0 {
    const HEADER: usize = 6;
    const SIGNED: bool = true;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn column_values(column: *const u8, i: usize) -> __m256i {
        // SAFETY: as the caller guarantees; the fifth bits follow the scales, the
        // nibbles the fifth bits.
        unsafe {
            simd::five_bits_less_16(
                column.add(GROUP * 2 + i * 4),
                column.add(GROUP * 6 + i * 16),
            )
        }
    }
}

impl Packed for Q8_0 {
    const HEADER: usize = 2;
    const SIGNED: bool = true;
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn column_values(column: *const u8, i: usize) -> __m256i {
        // SAFETY: as the caller guarantees; the values follow the eight scales.
        unsafe { simd::bytes(column.add(GROUP * 2 + i * 32)) }
    }
}

/// A `rows × cols` matrix of format `F` in the eight-row layout.
pub struct PackedRows<F> {
    data: Vec<u8>,
    rows: usize,
    blocks: usize,
    format: PhantomData<F>,
}

impl<F: Packed> PackedRows<F> {
    /// Repacks row-major GGUF blocks (`rows` rows of `cols / 32` blocks).
    pub fn new(raw: &[u8], rows: usize, cols: usize) -> Self {
        let bytes = block_bytes::<F>();
        let blocks = cols / 32;
        let groups = rows.div_ceil(GROUP);
        let head = F::HEADER;
        let mut data = vec![0u8; groups * blocks * GROUP * bytes];
        for r in 0..rows {
            let (g, i) = (r / GROUP, r % GROUP);
            for b in 0..blocks {
                let src = &raw[(r * blocks + b) * bytes..][..bytes];
                let column = (g * blocks + b) * GROUP * bytes;
                // The scale, the second header field (if any), then the values.
                data[column + i * 2..][..2].copy_from_slice(&src[..2]);
                let second = head - 2;
                if second > 0 {
                    data[column + GROUP * 2 + i * second..][..second]
                        .copy_from_slice(&src[2..head]);
                }
                let values = bytes - head;
                data[column + GROUP * head + i * values..][..values].copy_from_slice(&src[head..]);
            }
        }
        Self {
            data,
            rows,
            blocks,
            format: PhantomData,
        }
    }

    /// Group `g`'s bytes: its block columns one after another.
    fn group(&self, g: usize) -> &[u8] {
        let len = self.blocks * GROUP * block_bytes::<F>();
        &self.data[g * len..(g + 1) * len]
    }

    /// Row `r` in the original GGUF layout (for the portable path and tests).
    pub fn row(&self, r: usize) -> Vec<u8> {
        let bytes = block_bytes::<F>();
        let head = F::HEADER;
        let (g, i) = (r / GROUP, r % GROUP);
        let group = self.group(g);
        let mut out = Vec::with_capacity(self.blocks * bytes);
        for b in 0..self.blocks {
            let column = &group[b * GROUP * bytes..][..GROUP * bytes];
            out.extend_from_slice(&column[i * 2..i * 2 + 2]);
            let second = head - 2;
            out.extend_from_slice(&column[GROUP * 2 + i * second..][..second]);
            let values = bytes - head;
            out.extend_from_slice(&column[GROUP * head + i * values..][..values]);
        }
        out
    }

    /// Products of group `g`'s eight rows with up to four activation rows:
    /// `out[i][r]` = row `8g + i` · `a[r]` (rows past the matrix give zero). One or two
    /// activation rows go against all eight weight rows at once; three or four against
    /// four weight rows at a time, so that the accumulators stay in registers.
    pub fn dot_group(&self, g: usize, a: &[&Q8Row]) -> [[f32; 4]; GROUP] {
        assert!(!a.is_empty() && a.len() <= 4);
        for row in a {
            assert!(row.d.len() >= self.blocks && row.qs.len() >= self.blocks * 32);
        }
        let mut out = [[0f32; 4]; GROUP];
        #[cfg(target_arch = "x86_64")]
        if crate::simd::avx2() {
            let group = self.group(g);
            macro_rules! rows {
                ($n:literal, $r:literal) => {
                    for first in (0..GROUP).step_by($r) {
                        // SAFETY: the CPU features were checked; the group holds `blocks`
                        // columns and every activation row as many blocks.
                        let got = unsafe {
                            simd::dot_group::<$n, $r, F>(
                                group,
                                self.blocks,
                                first,
                                std::array::from_fn(|r| a[r]),
                            )
                        };
                        for (out, got) in out[first..first + $r].iter_mut().zip(got) {
                            out[..$n].copy_from_slice(&got);
                        }
                    }
                };
            }
            match a.len() {
                1 => rows!(1, 8),
                2 => rows!(2, 8),
                3 => rows!(3, 4),
                _ => rows!(4, 4),
            }
            return out;
        }
        for (i, out) in out.iter_mut().enumerate() {
            if g * GROUP + i < self.rows {
                let w = self.row(g * GROUP + i);
                for (o, a) in out.iter_mut().zip(a) {
                    *o = block32::dot::<F>(&w, a);
                }
            }
        }
        out
    }

    /// Products of rows `8g + first` and `8g + first + 1` with up to four activation rows
    /// (`out[i][r]`), for prompts on CPUs without AVX-512 VNNI: each weight block decoded
    /// once for all of them.
    pub fn dot_pair(&self, g: usize, first: usize, a: &[&Q8Row]) -> [[f32; 4]; 2] {
        assert!(first + 2 <= GROUP && (1..=4).contains(&a.len()));
        for row in a {
            assert!(row.d.len() >= self.blocks && row.qs.len() >= self.blocks * 32);
        }
        let mut out = [[0f32; 4]; 2];
        #[cfg(target_arch = "x86_64")]
        if crate::simd::avx2() {
            let group = self.group(g);
            macro_rules! rows {
                ($n:literal) => {{
                    // SAFETY: the CPU features were checked; the group holds `blocks`
                    // columns and every activation row as many blocks.
                    let got = unsafe {
                        simd::dot_rows::<2, $n, F>(
                            group,
                            self.blocks,
                            first,
                            std::array::from_fn(|r| a[r]),
                        )
                    };
                    for (out, got) in out.iter_mut().zip(got) {
                        out[..$n].copy_from_slice(&got);
                    }
                }};
            }
            match a.len() {
                1 => rows!(1),
                2 => rows!(2),
                3 => rows!(3),
                _ => rows!(4),
            }
            return out;
        }
        self.dot_pair_portable(g, first, a, &mut out);
        out
    }

    /// Products of rows `8g + first` and `8g + first + 1` with a tile's activation rows
    /// (`out[i][k]`), for prompts on CPUs with AVX-512 VNNI (portable code elsewhere).
    pub fn dot_pair_tile(&self, g: usize, first: usize, tile: &ActTile) -> [[f32; TILE_ROWS]; 2] {
        assert!(first + 2 <= GROUP && tile.blocks() == self.blocks);
        #[cfg(target_arch = "x86_64")]
        if crate::simd::vnni() {
            // SAFETY: the CPU features were checked; the group holds `blocks` columns, as
            // many as the tile's rows.
            return unsafe { simd::dot_pair_tile::<F>(self.group(g), first, tile) };
        }
        let rows: Vec<Q8Row> = (0..tile.rows()).map(|k| tile.row(k)).collect();
        let rows: Vec<&Q8Row> = rows.iter().collect();
        let mut out = [[0f32; TILE_ROWS]; 2];
        self.dot_pair_portable(g, first, &rows, &mut out);
        out
    }

    /// [`Self::dot_pair`] in portable code, into `out[i][r]`.
    fn dot_pair_portable<const N: usize>(
        &self,
        g: usize,
        first: usize,
        a: &[&Q8Row],
        out: &mut [[f32; N]; 2],
    ) {
        for (i, out) in out.iter_mut().enumerate() {
            if g * GROUP + first + i < self.rows {
                let w = self.row(g * GROUP + first + i);
                for (o, a) in out.iter_mut().zip(a) {
                    *o = block32::dot::<F>(&w, a);
                }
            }
        }
    }
}

impl<F: Packed> Layout for PackedRows<F> {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.data);
    }

    fn reads_act_tiles(&self) -> bool {
        true
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8(a, tiles, _) = acts else {
            unreachable!("block-of-32 formats take Q8 activations");
        };
        let (packed, n, start, end) = (self, kernels.len(), range.start, range.end);
        let a: Vec<&q8::Q8Row> = a.iter().collect();
        let put = |t: usize, r: usize, v: f32| {
            if r < end {
                out.set(t, r, v);
            }
        };
        let groups = start / GROUP..end.div_ceil(GROUP);
        if n < 4 {
            // Decoding: each group's eight weight rows against every activation row.
            for g in groups {
                for (i, got) in packed.dot_group(g, &a).iter().enumerate() {
                    for (t, &v) in got.iter().enumerate().take(n) {
                        put(t, g * GROUP + i, v);
                    }
                }
            }
        } else if !tiles.is_empty() {
            // A prompt under AVX-512 VNNI: two weight rows by a whole tile at a time,
            // the chunk's results gathered per activation row and written as runs.
            let base = groups.start * GROUP;
            let mut runs = [[0f32; CHUNK + GROUP]; TILE_ROWS];
            for (tile, t0) in tiles.iter().zip((0..n).step_by(TILE_ROWS)) {
                for g in groups.clone() {
                    for first in (0..GROUP).step_by(2) {
                        let got = packed.dot_pair_tile(g, first, tile);
                        let at = g * GROUP + first - base;
                        for (k, run) in runs.iter_mut().enumerate().take(tile.rows()) {
                            (run[at], run[at + 1]) = (got[0][k], got[1][k]);
                        }
                    }
                }
                for (k, run) in runs.iter().enumerate().take(tile.rows()) {
                    out.set_run(t0 + k, start, &run[start - base..]);
                }
            }
        } else {
            // A prompt: two weight rows by four activation rows at a time, over
            // activation tiles that stay in the first-level cache.
            for t0 in (0..n).step_by(ACT_TILE) {
                let t1 = (t0 + ACT_TILE).min(n);
                for g in groups.clone() {
                    for first in (0..GROUP).step_by(2) {
                        for t in (t0..t1).step_by(4) {
                            let rows = &a[t..(t + 4).min(t1)];
                            let got = packed.dot_pair(g, first, rows);
                            for (i, got) in got.iter().enumerate() {
                                for (k, &v) in got.iter().enumerate().take(rows.len()) {
                                    put(t + k, g * GROUP + first + i, v);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_row;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::OwnFormat;

    #[test]
    fn repacking_keeps_every_row_and_every_product() {
        let mut rng = Xorshift::new(17);
        check::<Q4_0>(OwnFormat::Q4_0, &mut rng);
        check::<Q4_1>(OwnFormat::Q4_1, &mut rng);
        check::<Q5_0>(OwnFormat::Q5_0, &mut rng);
        check::<Q8_0>(OwnFormat::Q8_0, &mut rng);
    }

    /// Random rows of `own` (`F`) come back as they were, and every kernel's product of
    /// them equals the portable one, bit for bit.
    fn check<F: Packed>(own: &OwnFormat, rng: &mut Xorshift) {
        let format = F::NAME;
        let (rows, cols) = (19, 32 * 9);
        let raw = sample::weights(own, rows, cols, rng);
        let packed = PackedRows::<F>::new(&raw, rows, cols);
        let row_bytes = own.row_bytes(cols);
        for r in 0..rows {
            assert_eq!(packed.row(r), raw[r * row_bytes..(r + 1) * row_bytes]);
        }
        let wide: Vec<Q8Row> = (0..TILE_ROWS)
            .map(|_| quantize_row(&sample::activations(1, cols, 3.0, rng)))
            .collect();
        // Weight row `r` (zero past the matrix) times `a`, as the portable code has it.
        let want = |r: usize, a: &Q8Row| {
            if r < rows {
                block32::dot::<F>(&raw[r * row_bytes..][..row_bytes], a)
            } else {
                0.0
            }
        };
        for g in 0..rows.div_ceil(GROUP) {
            for n in 1..=TILE_ROWS {
                let a: Vec<&Q8Row> = wide[..n].iter().collect();
                let tile = ActTile::new(&a, packed.blocks);
                for first in (0..GROUP).step_by(2) {
                    let got = packed.dot_pair_tile(g, first, &tile);
                    let narrow = (n <= 4).then(|| packed.dot_pair(g, first, &a));
                    for i in 0..2 {
                        let r = g * GROUP + first + i;
                        for (k, a) in a.iter().enumerate() {
                            let msg = format!("{format} tile: row {r}, activation row {k}");
                            assert_eq!(want(r, a).to_bits(), got[i][k].to_bits(), "{msg}");
                            if let Some(narrow) = narrow {
                                let msg = format!("{format} pair: row {r}, row {k}");
                                assert_eq!(want(r, a).to_bits(), narrow[i][k].to_bits(), "{msg}");
                            }
                        }
                        let zeros = &got[i][n..];
                        assert!(zeros.iter().all(|&v| v == 0.0), "{format}: past the tile");
                    }
                }
                if n <= 4 {
                    let got = packed.dot_group(g, &a);
                    for (i, got) in got.iter().enumerate() {
                        let r = g * GROUP + i;
                        for (k, a) in a.iter().enumerate() {
                            let msg = format!("{format} group: row {r}, activation row {k}");
                            assert_eq!(want(r, a).to_bits(), got[k].to_bits(), "{msg}");
                        }
                    }
                }
            }
        }
    }
}
