//! Q4_K weights interleaved sixteen rows at a time, one weight row per 32-bit lane, for the
//! AVX-512 VNNI kernel: one multiply-add instruction takes four consecutive values of each
//! of sixteen rows against the same four activations (broadcast), so every lane keeps one
//! weight row's sum and no horizontal sums are ever needed. CPUs with AVX2 alone take the
//! same layout eight rows (half a line) at a time ([`avx2`]).
//!
//! Per group of sixteen rows (the last one padded with zero rows) and per super-block,
//! [`LINES`] 64-byte lines: one with the rows' `d`, then their `dmin` (as the file's `f16`),
//! two lines of 6-bit scales (per sub-block the sixteen rows' bytes), two lines of
//! minimums (per pair of sub-blocks, each row's two minimums as bytes), then 32 lines of
//! values (37 lines where the rows' super-blocks take 36: decoding streams them): line
//! `s` holds values `8s..8s + 8` of every row, row `r`'s four bytes at `4r` with values
//! `8s..8s + 4` in the low nibbles and `8s + 4..8s + 8` in the high ones.
//!
//! The arithmetic is that of [`crate::quant::formats::q4_k::dot`]: the integer sums per pair
//! of sub-blocks are exact whatever their order, and the floating-point steps (one fused
//! multiply-add per pair for the GEMM kernel, per super-block for the GEMV) are the same
//! operations on the same values, so results are bit-identical.

use crate::quant::formats::kquant;
use crate::quant::formats::q4_k;
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::act_tile::Line;
use super::layout::Layout;
#[cfg(target_arch = "x86_64")]
use super::layout::{lane_groups, LANE_ROWS};
use super::output::Columns;
use super::{Activations, RowKernel};
use crate::quant::q8k::QK_K;

/// Weight rows per group: one per 32-bit lane of a 512-bit vector.
pub use crate::simd::LANES_512 as ROWS;
/// Lines per group and super-block.
pub const LINES: usize = 37;
/// Where a super-block's lines of minimums and of values start.
const MINS: usize = 3;
const VALUES: usize = 5;

/// A Q4_K matrix in the sixteen-row layout (see the module).
pub struct Q4kLanes {
    blocks: usize,
    lines: Vec<Line>,
}

impl Q4kLanes {
    /// Interleaves row-major Q4_K super-blocks (`rows` rows of `blocks` each).
    pub fn new(raw: &[u8], rows: usize, blocks: usize) -> Self {
        assert_eq!(raw.len(), rows * blocks * q4_k::BYTES);
        let groups = rows.div_ceil(ROWS);
        let mut lines = vec![Line([0; 64]); groups * blocks * LINES];
        for r in 0..rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * q4_k::BYTES..][..q4_k::BYTES];
                let out = &mut lines[(g * blocks + b) * LINES..][..LINES];
                let f16 = |at: usize| half::f16::from_le_bytes([block[at], block[at + 1]]);
                out[0].0[2 * lane..2 * lane + 2].copy_from_slice(&f16(0).to_le_bytes());
                out[0].0[32 + 2 * lane..34 + 2 * lane].copy_from_slice(&f16(2).to_le_bytes());
                for j in 0..8 {
                    let (scale, min) = kquant::scale_min_k4(j, &block[4..16]);
                    out[1 + j / 4].0[(j % 4) * ROWS + lane] = scale as u8;
                    let pair = j / 2;
                    out[MINS + pair / 2].0[32 * (pair % 2) + 2 * lane + j % 2] = min as u8;
                }
                let value = |k: usize| {
                    let byte = block[16 + (k / 64) * 32 + k % 32];
                    if (k / 32).is_multiple_of(2) {
                        byte & 0x0F
                    } else {
                        byte >> 4
                    }
                };
                for s in 0..QK_K / 8 {
                    for t in 0..4 {
                        let k = 8 * s + t;
                        out[VALUES + s].0[4 * lane + t] = value(k) | (value(k + 4) << 4);
                    }
                }
            }
        }
        Self { blocks, lines }
    }

    /// Group `g`'s lines, super-block after super-block.
    pub fn group(&self, g: usize) -> &[Line] {
        let len = self.blocks * LINES;
        &self.lines[g * len..(g + 1) * len]
    }
}

#[cfg(target_arch = "x86_64")]
pub use simd::dot_group;

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{Line, Q4kLanes, LINES, MINS, ROWS, VALUES};
    use crate::quant::q8k::Q8KRow;
    use crate::quant::q8k::QK_K;
    use crate::quant::RowKernel;
    use crate::simd::int_lanes::pair16;
    use crate::simd::prefetch::{prefetch_span, Upcoming};

    /// Group `g`'s sixteen rows against `T` activation rows, each rounded as its kernel
    /// says: `out[t][r]` is row `16g + r` · `a[t]` (zero past the matrix). `soon`: lines
    /// to ask the memory for meanwhile ([`Upcoming`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI) must be available
    /// ([`crate::simd::vnni`]).
    pub unsafe fn dot_group<const T: usize>(
        m: &Q4kLanes,
        g: usize,
        a: [&Q8KRow; T],
        kernels: [RowKernel; T],
        soon: Upcoming,
    ) -> [[f32; ROWS]; T] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
            group_vnni(m.group(g), m.blocks, a, kernels, soon)
        }
    }

    /// [`dot_group`] on a group's lines. Per sub-block: its 32 values of the sixteen rows
    /// decoded into eight vectors, then per activation row eight multiply-adds of integers
    /// (four activations broadcast each) and one multiplication by the rows' scales; per
    /// pair of sub-blocks one 16-bit multiply-add for the minimum terms, then the
    /// floating-point steps, one lane per weight row.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI); the arguments are [`dot_group`]'s, as its caller guarantees them.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
    unsafe fn group_vnni<const T: usize>(
        lines: &[Line],
        blocks: usize,
        a: [&Q8KRow; T],
        kernels: [RowKernel; T],
        mut soon: Upcoming,
    ) -> [[f32; ROWS]; T] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let ahead = crate::simd::cpu::prefetch_ahead();
            assert!(lines.len() >= blocks * LINES);
            let per_pair = kernels.map(RowKernel::in_group_of_four);
            let low = _mm512_set1_epi8(0x0F);
            let zero = _mm512_setzero_si512();
            let mut acc = [_mm512_setzero_ps(); T];
            let mut acc_min = [_mm512_setzero_ps(); T];
            for b in 0..blocks {
                let base = lines.as_ptr().add(b * LINES);
                prefetch_span(base, LINES * 64, ahead);
                soon.step();
                let line = |k: usize| base.add(k) as *const __m512i;
                let d = _mm512_cvtph_ps(_mm256_load_si256(line(0) as *const __m256i));
                let dmin = _mm512_cvtph_ps(_mm256_load_si256((line(0) as *const __m256i).add(1)));
                let mut isum = [zero; T];
                let mut imin = [zero; T];
                for pair in 0..4 {
                    let mut psum = [zero; T];
                    for j in [2 * pair, 2 * pair + 1] {
                        let scales = (line(1 + j / 4) as *const u8).add((j % 4) * ROWS);
                        let scale = _mm512_cvtepu8_epi32(_mm_load_si128(scales as *const __m128i));
                        let mut x = [zero; 8];
                        for (h, x) in x.chunks_exact_mut(2).enumerate() {
                            let v = _mm512_load_si512(line(VALUES + 4 * j + h));
                            x[0] = _mm512_and_si512(v, low);
                            x[1] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                        }
                        for t in 0..T {
                            let q8 = a[t].qs.as_ptr().add(b * QK_K + 32 * j) as *const i32;
                            let mut dot = zero;
                            for (h, x) in x.iter().enumerate() {
                                // Values 4h..4h + 4 of the sub-block: x[2s] holds 8s..8s + 4,
                                // x[2s + 1] holds 8s + 4..8s + 8.
                                let y = _mm512_set1_epi32(q8.add(h).read_unaligned());
                                dot = _mm512_dpbusd_epi32(dot, *x, y);
                            }
                            psum[t] = _mm512_add_epi32(psum[t], _mm512_mullo_epi32(dot, scale));
                        }
                    }
                    let mins = (line(MINS + pair / 2) as *const __m256i).add(pair % 2);
                    let mins = _mm512_cvtepu8_epi16(_mm256_load_si256(mins));
                    for t in 0..T {
                        let bsums = a[t].bsums.as_ptr().add(b * 16 + 4 * pair);
                        let sums = pair16(*bsums + *bsums.add(1), *bsums.add(2) + *bsums.add(3));
                        let sums = _mm512_set1_epi32(sums);
                        let pmin = _mm512_madd_epi16(mins, sums);
                        if per_pair[t] {
                            let da = _mm512_set1_ps(*a[t].d.get_unchecked(b));
                            let (dd, dm) = (_mm512_mul_ps(d, da), _mm512_mul_ps(dmin, da));
                            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(psum[t]), dd, acc[t]);
                            acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pmin), dm, acc_min[t]);
                        } else {
                            isum[t] = _mm512_add_epi32(isum[t], psum[t]);
                            imin[t] = _mm512_add_epi32(imin[t], pmin);
                        }
                    }
                }
                for t in 0..T {
                    if !per_pair[t] {
                        let da = _mm512_set1_ps(*a[t].d.get_unchecked(b));
                        let (dd, dm) = (_mm512_mul_ps(d, da), _mm512_mul_ps(dmin, da));
                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), dd, acc[t]);
                        acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin[t]), dm, acc_min[t]);
                    }
                }
            }
            let mut out = [[0f32; ROWS]; T];
            for t in 0..T {
                _mm512_storeu_ps(out[t].as_mut_ptr(), _mm512_sub_ps(acc[t], acc_min[t]));
            }
            out
        }
    }
}

impl Layout for Q4kLanes {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.lines);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8K(a, _) = acts else {
            unreachable!("Q4_K takes Q8_K activations");
        };
        #[cfg(target_arch = "x86_64")]
        {
            let (m, n, start, end) = (self, kernels.len(), range.start, range.end);
            let vnni = crate::simd::vnni();
            // Sixteen weight rows (one per lane) by up to four activation rows.
            let all: Vec<usize> = (0..n).collect();
            lane_groups(
                out,
                start..end,
                &all,
                4,
                (|g| m.group(g), m.blocks),
                |g, four, soon| {
                    let mut got = [[0f32; LANE_ROWS]; 4];
                    // SAFETY: the layout is only built where the CPU has AVX2, and the VNNI
                    // kernel only runs where it has AVX-512 VNNI.
                    with_row_count!(four.len(), got, T => unsafe {
                        let a = std::array::from_fn(|k| &a[four[k]]);
                        let kernels = std::array::from_fn(|k| kernels[four[k]]);
                        match vnni {
                            true => dot_group::<T>(m, g, a, kernels, soon),
                            false => avx2::dot_group::<T>(m, g, a, kernels, soon),
                        }
                    });
                    got
                },
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (a, kernels, range, out);
            unreachable!("the layout is only built where the CPU has AVX2");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8k::quantize_row_q8k;
    use crate::quant::q8k::Q8KRow;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::{OwnFormat, RowKernel};
    use crate::simd::prefetch::Upcoming;

    /// A kernel's group of sixteen rows against one to four activation rows.
    type GroupKernel = fn(&Q4kLanes, usize, &[&Q8KRow], &[RowKernel]) -> Vec<[f32; ROWS]>;

    /// Every row of every group, against one to four activation rows of either rounding
    /// (in every position of a pass), equals the portable dot product bit for bit.
    fn assert_matches_the_portable_kernel(dot: GroupKernel) {
        let mut rng = Xorshift::new(9);
        let (rows, cols) = (37, 3 * QK_K);
        let raw = sample::weights(OwnFormat::Q4_K, rows, cols, &mut rng);
        let m = Q4kLanes::new(&raw, rows, cols / QK_K);
        let kernels = [
            RowKernel::Gemm4,
            RowKernel::Gemv,
            RowKernel::Gemm4,
            RowKernel::Gemm4,
        ];
        let acts: Vec<Q8KRow> = kernels
            .iter()
            .map(|&k| quantize_row_q8k(&sample::activations(1, cols, 4.0, &mut rng), k))
            .collect();
        let row_bytes = cols / QK_K * q4_k::BYTES;
        for g in 0..rows.div_ceil(ROWS) {
            for (from, to) in [(0, 4), (1, 2), (0, 3), (2, 4)] {
                let a: Vec<&Q8KRow> = acts[from..to].iter().collect();
                let got = dot(&m, g, &a, &kernels[from..to]);
                for (got, t) in got.iter().zip(from..to) {
                    for (lane, got) in got.iter().enumerate() {
                        let r = g * ROWS + lane;
                        let want = match r < rows {
                            true => {
                                q4_k::dot(&raw[r * row_bytes..][..row_bytes], &acts[t], kernels[t])
                            }
                            false => 0.0,
                        };
                        let at = format!("row {r}, act {t} of {from}..{to}");
                        assert_eq!(want.to_bits(), got.to_bits(), "{at}");
                    }
                }
            }
        }
    }

    /// The AVX-512 VNNI kernel.
    #[test]
    fn vnni_kernel_is_bit_identical_to_the_portable_one() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run. A CPU
        // without it cannot run it; the end-to-end tests under FERRITE_CPU cover the rest.
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        // Upcoming lines from the group itself: asking for them changes nothing.
        // SAFETY: VNNI was checked.
        assert_matches_the_portable_kernel(|m, g, a, k| unsafe {
            by_row_count!(dot_group, (m, g), Upcoming::new(m.group(0), 3), a, k)
        });
    }

    /// The AVX2 kernel at its integer sums' extremes: every nibble 15 against every
    /// activation -128, whose sixteen products a 16-bit lane adds (-30,720) come nearest
    /// to overflowing it.
    #[test]
    fn avx2_kernel_holds_the_largest_sums() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx2, "avx2") {
            return;
        }
        let mut rng = Xorshift::new(5);
        let (rows, cols) = (16, 2 * QK_K);
        let mut raw = sample::weights(OwnFormat::Q4_K, rows, cols, &mut rng);
        for block in raw.chunks_exact_mut(q4_k::BYTES) {
            // After the two scales and the twelve bytes of sub-block scales and minimums.
            block[16..].fill(0xFF);
        }
        let m = Q4kLanes::new(&raw, rows, cols / QK_K);
        // The quantizer gives -127 at most; the kernel must hold a row of -128 too.
        let mut act = quantize_row_q8k(&vec![-1.0; cols], RowKernel::Gemm4);
        act.qs.fill(-128);
        for (sum, q) in act.bsums.iter_mut().zip(act.qs.chunks_exact(16)) {
            *sum = q.iter().map(|&q| i32::from(q)).sum();
        }
        let kernels = [RowKernel::Gemm4; 4];
        // SAFETY: AVX2 was checked.
        let got = unsafe {
            avx2::dot_group::<4>(&m, 0, [&act; 4], kernels, Upcoming::new(m.group(0), 3))
        };
        let row_bytes = cols / QK_K * q4_k::BYTES;
        for (r, got) in got[3].iter().enumerate() {
            let want = q4_k::dot(&raw[r * row_bytes..][..row_bytes], &act, RowKernel::Gemm4);
            assert_eq!(want.to_bits(), got.to_bits(), "row {r}");
        }
    }

    /// The AVX2 kernel.
    #[test]
    fn avx2_kernel_is_bit_identical_to_the_portable_one() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx2, "avx2") {
            return;
        }
        // SAFETY: AVX2 was checked.
        assert_matches_the_portable_kernel(|m, g, a, k| unsafe {
            by_row_count!(avx2::dot_group, (m, g), Upcoming::new(m.group(0), 3), a, k)
        });
    }
}
