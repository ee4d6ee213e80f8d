//! Q6_K weights interleaved sixteen rows at a time, one weight row per 32-bit lane, for the
//! AVX-512 VNNI kernel (as [`super::q4k_lanes`] does for Q4_K): one instruction multiplies
//! four consecutive values of sixteen rows by the same four activations, so every lane
//! keeps one weight row's sums and none are ever summed across lanes. CPUs with AVX2 alone
//! take the same layout eight rows (half a line) at a time ([`avx2`]).
//!
//! Per group of sixteen rows (the last one padded with zero rows) and per super-block,
//! [`LINES`] 64-byte lines: the rows' `d` (as `f32`), four lines of scales (per 16-value
//! sub-block, the sixteen rows' signed bytes), then three lines of values per sub-block,
//! six bits a value as in the file (four low bits and two high ones). The kernels multiply four values of every
//! row at a time: "vector" `c` of sub-block `j` holds values `16j + 4c..16j + 4c + 4` of
//! every row as unsigned bytes (stored `+ 32`), row `r`'s at `4r`. Of those four vectors,
//! the first line holds vectors 0 and 1's low four bits (0's in the low nibbles), the
//! second vectors 2 and 3's, the third the high two bits of all four (vector `c`'s at bit
//! `2c`). [`simd::sub_block`] unpacks them with a few shifts and masks: decode streams
//! the weights from memory, and unpacked bytes were a third more of them (69 lines per
//! super-block instead of 53).
//!
//! Rows of micro-batches of 8 or more take the tiled kernel (`tiled` with AVX-512 VNNI,
//! the tiled plan of [`avx2`] without: llama.cpp's tiled matmul's arithmetic). For the
//! rest the arithmetic is that of [`crate::quant::formats::q6_k::dot`], ggml's AVX2 dot
//! product:
//! eight integer lanes per super-block (lane `l` takes values `4l..4l + 4` of every 32 and
//! its own share of the `32 · Σ scale · activations` correction), each converted and
//! added with one fused multiply-add into eight `f32` accumulators, summed at the end as
//! `hsum_float_8`. The integer lanes are exact whatever the order, and the
//! floating-point steps are the same operations on the same values, one weight row per
//! vector lane, so results are bit-identical.

use crate::quant::formats::q6_k::{self, Q6K};
use crate::quant::formats::view;
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
mod avx2;
mod tiled;

use super::act_tile::Line;

use super::layout::Layout;
#[cfg(target_arch = "x86_64")]
use super::layout::{lane_groups, lane_groups_by_plan, LANE_ROWS};
use super::output::Columns;
use super::{Activations, RowKernel};

/// Weight rows per group: one per 32-bit lane of a 512-bit vector.
pub use crate::simd::LANES_512 as ROWS;
/// Lines per group and super-block.
pub const LINES: usize = 53;
/// Where a super-block's lines of scales and of values start.
const SCALES: usize = 1;
const VALUES: usize = 5;

/// A Q6_K matrix in the sixteen-row layout (see the module).
pub struct Q6kLanes {
    blocks: usize,
    lines: Vec<Line>,
}

impl Q6kLanes {
    /// Interleaves row-major Q6_K super-blocks (`rows` rows of `blocks` each).
    pub fn new(raw: &[u8], rows: usize, blocks: usize) -> Self {
        assert_eq!(raw.len(), rows * blocks * q6_k::BYTES);
        let groups = rows.div_ceil(ROWS);
        let mut lines = vec![Line([0; 64]); groups * blocks * LINES];
        for r in 0..rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            for b in 0..blocks {
                let block = &raw[(r * blocks + b) * q6_k::BYTES..][..q6_k::BYTES];
                let out = &mut lines[(g * blocks + b) * LINES..][..LINES];
                let d = half::f16::from_le_bytes([block[208], block[209]]).to_f32();
                out[0].0[4 * lane..4 * lane + 4].copy_from_slice(&d.to_le_bytes());
                for (j, &scale) in block[192..208].iter().enumerate() {
                    out[SCALES + j / 4].0[(j % 4) * ROWS + lane] = scale;
                }
                let values = view::<Q6K>(block).values();
                for (j, sixteen) in values.chunks_exact(16).enumerate() {
                    let [low, next, high] = &mut out[VALUES + 3 * j..][..3] else {
                        unreachable!("three lines per sub-block");
                    };
                    for i in 0..4 {
                        let v: [u8; 4] = std::array::from_fn(|c| sixteen[4 * c + i]);
                        let at = 4 * lane + i;
                        low.0[at] = (v[0] & 0x0F) | (v[1] << 4);
                        next.0[at] = (v[2] & 0x0F) | (v[3] << 4);
                        high.0[at] =
                            (v[0] >> 4) | (v[1] >> 4) << 2 | (v[2] >> 4) << 4 | (v[3] >> 4) << 6;
                    }
                }
            }
        }
        Self { blocks, lines }
    }

    /// Group `g`'s lines, super-block after super-block.
    fn group(&self, g: usize) -> &[Line] {
        let len = self.blocks * LINES;
        &self.lines[g * len..(g + 1) * len]
    }
}

#[cfg(target_arch = "x86_64")]
pub use simd::dot_group;

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{Line, Q6kLanes, LINES, ROWS, SCALES, VALUES};
    use crate::quant::q8k::Q8KRow;
    use crate::quant::q8k::QK_K;
    use crate::simd::int_lanes::pair16;
    use crate::simd::prefetch::{prefetch_span, Upcoming};

    /// Group `g`'s sixteen rows against `T` activation rows: `out[t][r]` is row
    /// `16g + r` · `a[t]` (zero past the matrix). `soon`: lines to ask the memory for
    /// meanwhile ([`Upcoming`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI) must be available
    /// ([`crate::simd::vnni`]).
    pub unsafe fn dot_group<const T: usize>(
        m: &Q6kLanes,
        g: usize,
        a: [&Q8KRow; T],
        soon: Upcoming,
    ) -> [[f32; ROWS]; T] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
            group_vnni(m.group(g), m.blocks, a, soon)
        }
    }

    /// Sub-block `j`'s four vectors of values (see the module), unpacked from its three
    /// lines in the super-block at `lines`.
    ///
    /// # Safety
    /// AVX-512F and BW must be available; `lines` points to a whole super-block.
    #[inline(always)]
    pub(super) unsafe fn sub_block(lines: *const Line, j: usize) -> [__m512i; 4] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let line =
                |k: usize| _mm512_load_si512(lines.add(VALUES + 3 * j + k) as *const __m512i);
            let (low, next, high) = (line(0), line(1), line(2));
            let nibble = _mm512_set1_epi8(0x0F);
            let top = _mm512_set1_epi8(0x30);
            // Shifts of 16-bit lanes: the bits a byte takes from its neighbour are masked off.
            let low = [
                _mm512_and_si512(low, nibble),
                _mm512_and_si512(_mm512_srli_epi16::<4>(low), nibble),
                _mm512_and_si512(next, nibble),
                _mm512_and_si512(_mm512_srli_epi16::<4>(next), nibble),
            ];
            let high = [
                _mm512_slli_epi16::<4>(high),
                _mm512_slli_epi16::<2>(high),
                high,
                _mm512_srli_epi16::<2>(high),
            ];
            // low | (high & 0x30): 0xF0 | (0xCC & 0xAA).
            std::array::from_fn(|c| _mm512_ternarylogic_epi32::<0xF8>(low[c], high[c], top))
        }
    }

    /// Sub-block `j`'s scales of the sixteen rows, each as a pair of 16-bit integers in
    /// its row's lane.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and AVX-512 F and BW; `scales` points at the group's readable,
    /// 16-byte aligned scale lines and `j < 16`.
    #[inline(always)]
    unsafe fn scale_pairs(scales: *const Line, j: usize) -> __m512i {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let bytes = (scales.add(j / 4) as *const u8).add((j % 4) * ROWS);
            let words = _mm256_cvtepi8_epi16(_mm_load_si128(bytes as *const __m128i));
            let twice = _mm512_set_epi16(
                15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6, 5, 5, 4, 4,
                3, 3, 2, 2, 1, 1, 0, 0,
            );
            _mm512_permutexvar_epi16(twice, _mm512_castsi256_si512(words))
        }
    }

    /// [`dot_group`] on a group's lines. Per four values: one unsigned-by-signed 16-bit
    /// multiply-add of the sixteen rows' values with four broadcast activations, then one
    /// multiply-add of those pair sums with the sub-block's scales into lane `l`'s
    /// integers; per pair of sub-blocks, lane `l`'s share of the correction in one more;
    /// per super-block, one conversion and fused multiply-add per lane.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2, FMA, F16C and AVX-512 (F, VL, BW, VNNI); the arguments are [`dot_group`]'s, as its caller guarantees them.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl,avx512bw")]
    unsafe fn group_vnni<const T: usize>(
        lines: &[Line],
        blocks: usize,
        a: [&Q8KRow; T],
        mut soon: Upcoming,
    ) -> [[f32; ROWS]; T] {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let ahead = crate::simd::cpu::prefetch_ahead();
            assert!(lines.len() >= blocks * LINES);
            let zero = _mm512_setzero_si512();
            let mut acc = [[_mm512_setzero_ps(); 8]; T];
            for b in 0..blocks {
                let base = lines.as_ptr().add(b * LINES);
                prefetch_span(base, LINES * 64, ahead);
                soon.step();
                let q8: [*const i32; T] = a.map(|a| a.qs.as_ptr().add(b * QK_K) as *const i32);
                let mut lanes = [[zero; 8]; T];
                // Lane l's share of the correction, 32 · (sc[2l], sc[2l+1]) as 16-bit pairs.
                let mut both = [zero; 8];
                // Pairs of sub-blocks: with the pair's index the only one not known at compile
                // time, the eight lanes stay in registers.
                for (m, both) in both.iter_mut().enumerate() {
                    let scales = [2 * m, 2 * m + 1].map(|j| scale_pairs(base.add(SCALES), j));
                    let pair = _mm512_mask_blend_epi16(0xAAAA_AAAA, scales[0], scales[1]);
                    *both = _mm512_slli_epi16::<5>(pair);
                    for (h, &scales) in scales.iter().enumerate() {
                        let j = 2 * m + h;
                        let values = sub_block(base, j);
                        for (q, &w) in values.iter().enumerate() {
                            for t in 0..T {
                                let y = _mm512_set1_epi32(q8[t].add(4 * j + q).read_unaligned());
                                let products = _mm512_maddubs_epi16(w, y);
                                let lane = &mut lanes[t][4 * h + q];
                                *lane = _mm512_dpwssd_epi32(*lane, products, scales);
                            }
                        }
                    }
                }
                // Lane l subtracts 32 · (bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1]).
                for (lanes, a) in lanes.iter_mut().zip(&a) {
                    let bsums = a.bsums.as_ptr().add(b * 16);
                    for (l, (lane, &both)) in lanes.iter_mut().zip(&both).enumerate() {
                        let pair = pair16(-*bsums.add(2 * l), -*bsums.add(2 * l + 1));
                        *lane = _mm512_dpwssd_epi32(*lane, both, _mm512_set1_epi32(pair));
                    }
                }
                let dw = _mm512_load_ps(base as *const f32);
                for t in 0..T {
                    let d = _mm512_mul_ps(_mm512_set1_ps(*a[t].d.get_unchecked(b)), dw);
                    for (acc, &lane) in acc[t].iter_mut().zip(&lanes[t]) {
                        *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), *acc);
                    }
                }
            }
            // hsum_float_8, one weight row per vector lane.
            let mut out = [[0f32; ROWS]; T];
            for t in 0..T {
                let a = &acc[t];
                let r = [0, 1, 2, 3].map(|i| _mm512_add_ps(a[i], a[i + 4]));
                let sum = _mm512_add_ps(_mm512_add_ps(r[0], r[2]), _mm512_add_ps(r[1], r[3]));
                _mm512_storeu_ps(out[t].as_mut_ptr(), sum);
            }
            out
        }
    }
}

impl Layout for Q6kLanes {
    fn back_with_huge_pages(&self) {
        crate::huge_pages::back(&self.lines);
    }

    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], range: Range<usize>, out: &Columns) {
        let Activations::Q8K(a, once) = acts else {
            unreachable!("Q6_K takes Q8_K activations");
        };
        #[cfg(target_arch = "x86_64")]
        {
            let (m, start, end) = (self, range.start, range.end);
            // Rows of wide micro-batches take the tiled kernel, as in llama.cpp; the rest
            // the one-row arithmetic.
            let (wide, alone): (Vec<usize>, Vec<usize>) =
                (0..kernels.len()).partition(|&t| kernels[t].in_wide_batch());
            if !crate::simd::vnni() {
                // AVX2: the tiled plan four activation rows a pass, the dot product's
                // (eight lanes of eight rows in registers) one.
                let tiled = |g, four: &[usize], soon| {
                    let mut got = [[0f32; LANE_ROWS]; 4];
                    // SAFETY: the layout is only built where the CPU has AVX2.
                    with_row_count!(four.len(), got, T => unsafe {
                        avx2::dot_group::<T, true>(m, g, std::array::from_fn(|k| &a[four[k]]), soon)
                    });
                    got
                };
                // SAFETY: as above.
                let dot = |g, t: usize, soon| unsafe {
                    avx2::dot_group::<1, false>(m, g, [&a[t]], soon)[0]
                };
                let groups = (|g| m.group(g), m.blocks);
                lane_groups_by_plan(out, range, kernels, groups, tiled, dot);
                return;
            }
            if !wide.is_empty() {
                let offsets = once.q6k_offsets(a);
                // SAFETY: the VNNI kernels run only where the CPU has AVX-512 VNNI.
                unsafe { tiled::chunk(m, a, offsets, &wide, range.clone(), out) };
            }
            // Sixteen weight rows (one per lane) by two activation rows a pass: the eight
            // lanes' sums of three or four rows would not fit in registers.
            lane_groups(
                out,
                start..end,
                &alone,
                2,
                (|g| m.group(g), m.blocks),
                |g, two, soon| {
                    let mut got = [[0f32; LANE_ROWS]; 4];
                    // SAFETY: as above.
                    with_row_count!(two.len(), got, T => unsafe {
                        dot_group::<T>(m, g, std::array::from_fn(|k| &a[two[k]]), soon)
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
    use crate::quant::q8k::QK_K;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::{OwnFormat, RowKernel};
    use crate::simd::prefetch::Upcoming;

    /// A random `rows × cols` Q6_K matrix (raw and laid out) and `n` activation rows.
    fn sample_matrix(
        seed: u64,
        rows: usize,
        cols: usize,
        n: usize,
    ) -> (Vec<u8>, Q6kLanes, Vec<Q8KRow>) {
        let mut rng = Xorshift::new(seed);
        let raw = sample::weights(OwnFormat::Q6_K, rows, cols, &mut rng);
        let m = Q6kLanes::new(&raw, rows, cols / QK_K);
        let acts = (0..n)
            .map(|_| {
                let values = sample::activations(1, cols, 4.0, &mut rng);
                quantize_row_q8k(&values, RowKernel::Gemv)
            })
            .collect();
        (raw, m, acts)
    }

    /// The AVX2 kernels, both plans: every row of every group equals the portable dot
    /// product (one activation row) and the portable tiled product (one to four rows)
    /// bit for bit.
    #[test]
    fn avx2_kernels_are_bit_identical_to_the_portable_ones() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().avx2, "avx2") {
            return;
        }
        let (rows, cols) = (37, 3 * QK_K);
        let (raw, m, acts) = sample_matrix(23, rows, cols, 4);
        let row_bytes = cols / QK_K * q6_k::BYTES;
        let row = |r: usize| &raw[r * row_bytes..][..row_bytes];
        for g in 0..rows.div_ceil(ROWS) {
            let soon = || Upcoming::new(m.group(0), 3);
            // SAFETY: AVX2 was checked.
            let (one, four, three) = unsafe {
                (
                    avx2::dot_group::<1, false>(&m, g, [&acts[2]], soon()),
                    avx2::dot_group::<4, true>(&m, g, std::array::from_fn(|t| &acts[t]), soon()),
                    avx2::dot_group::<3, true>(&m, g, [&acts[3], &acts[1], &acts[0]], soon()),
                )
            };
            // A pass's last one or two rows of a wide batch.
            // SAFETY: the kernel's CPU features were checked above.
            let (alone, two) = unsafe {
                (
                    avx2::dot_group::<1, true>(&m, g, [&acts[1]], soon()),
                    avx2::dot_group::<2, true>(&m, g, [&acts[2], &acts[0]], soon()),
                )
            };
            for lane in 0..ROWS {
                let r = g * ROWS + lane;
                let real = r < rows;
                let dot = |t: usize| match real {
                    true => q6_k::dot(row(r), &acts[t]),
                    false => 0.0,
                };
                let tiled = |t: usize| match real {
                    true => q6_k::dot_tiled(row(r), &acts[t]),
                    false => 0.0,
                };
                assert_eq!(dot(2).to_bits(), one[0][lane].to_bits(), "row {r}, dot");
                for (t, four) in four.iter().enumerate() {
                    assert_eq!(tiled(t).to_bits(), four[lane].to_bits(), "row {r}, act {t}");
                }
                assert_eq!(
                    tiled(1).to_bits(),
                    alone[0][lane].to_bits(),
                    "row {r}, 1 of 1"
                );
                for (k, t) in [2, 0].into_iter().enumerate() {
                    assert_eq!(
                        tiled(t).to_bits(),
                        two[k][lane].to_bits(),
                        "row {r}, {t} of 2"
                    );
                }
                for (k, t) in [3, 1, 0].into_iter().enumerate() {
                    assert_eq!(
                        tiled(t).to_bits(),
                        three[k][lane].to_bits(),
                        "row {r}, {t} of 3"
                    );
                }
            }
        }
    }

    /// Every row of every group against one and two activation rows equals the portable
    /// dot product bit for bit.
    #[test]
    fn lanes_kernel_is_bit_identical_to_the_portable_one() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run. A CPU
        // without it cannot run it; the end-to-end tests under FERRITE_CPU cover the rest.
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        let (rows, cols) = (37, 3 * QK_K);
        let (raw, m, acts) = sample_matrix(19, rows, cols, 2);
        let row_bytes = cols / QK_K * q6_k::BYTES;
        for g in 0..rows.div_ceil(ROWS) {
            // SAFETY: VNNI was checked.
            let two = unsafe { dot_group::<2>(&m, g, [&acts[0], &acts[1]], Upcoming::NONE) };
            // SAFETY: the kernel's CPU features were checked above.
            let one = unsafe { dot_group::<1>(&m, g, [&acts[1]], Upcoming::new(m.group(0), 3)) };
            for lane in 0..ROWS {
                let r = g * ROWS + lane;
                for t in 0..2 {
                    let want = match r < rows {
                        true => q6_k::dot(&raw[r * row_bytes..][..row_bytes], &acts[t]),
                        false => 0.0,
                    };
                    assert_eq!(want.to_bits(), two[t][lane].to_bits(), "row {r}, act {t}");
                    if t == 1 {
                        assert_eq!(want.to_bits(), one[0][lane].to_bits(), "row {r} alone");
                    }
                }
            }
        }
    }
}
