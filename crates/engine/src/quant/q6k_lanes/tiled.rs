//! The sixteen-row Q6_K layout's kernel for rows of micro-batches of 8 or more, with the
//! arithmetic of llama.cpp's tiled matmul (`ggml-cpu/tiled`, its AVX-512 VNNI
//! microkernel), which llama.cpp takes for them: per super-block one exact integer sum of
//! the sixteen sub-blocks' scaled products (the values stored 32 higher, less 32 times the
//! activations' sums), one rounded product by `d`, added with a fused multiply-add times
//! the activation's scale. The portable twin is `crate::quant::formats::q6_k::dot_tiled`.
//!
//! The layout's values unpack (`simd::sub_block`) to what the kernel multiplies: four
//! values of every row per vector as unsigned bytes. Per sub-block of 16 and activation
//! row, four `vpdpbusd` (each with four activation bytes broadcast) start from −32 times
//! the activations' sum, and one multiplication by the rows' scales ends it.

use std::ops::Range;

use super::{Q6kLanes, LINES, ROWS, SCALES};
use crate::quant::act_tile::Line;
use crate::quant::output::Columns;
use crate::quant::q8k::Q8KRow;
use crate::quant::q8k::QK_K;

/// Activation rows per pass over a group's super-block.
const PASS: usize = 8;

/// Output features `range` of `m` (a multiple of 16 from its start) for activation rows
/// `rows` of `a`, whose Q6_K offsets (`SumsOnce::q6k_offsets`) are `offsets`.
///
/// # Safety
/// AVX-512 (F, VL, BW) and VNNI must be available.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn chunk(
    m: &Q6kLanes,
    a: &[Q8KRow],
    offsets: &[Vec<i32>],
    rows: &[usize],
    range: Range<usize>,
    out: &Columns,
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        let a: Vec<&Q8KRow> = rows.iter().map(|&t| &a[t]).collect();
        let offsets: Vec<&[i32]> = rows.iter().map(|&t| &offsets[t][..]).collect();
        assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
        assert!(offsets.iter().all(|o| o.len() >= m.blocks * 16));
        let n = rows.len();
        let mut acc = vec![0f32; n * ROWS];
        // A super-block's values unpacked once for all its passes.
        let mut values = [Line([0; 64]); QK_K / 4];
        for g in range.start / ROWS..range.end.div_ceil(ROWS) {
            acc.fill(0.0);
            let group = m.group(g);
            for b in 0..m.blocks {
                let lines = &group[b * LINES..(b + 1) * LINES];
                // Several passes share one unpacking; a lone pass unpacks as it goes.
                let unpacked = n > PASS;
                if unpacked {
                    simd::unpack(lines, &mut values);
                }
                for t0 in (0..n).step_by(PASS) {
                    let (a, offsets) = (&a[t0..], &offsets[t0..]);
                    let acc = &mut acc[t0 * ROWS..];
                    let v = &values;
                    macro_rules! pass {
                    ($($t:literal)*) => {
                        match ((n - t0).min(PASS), unpacked) {
                            $(
                                ($t, true) => simd::pass::<$t, true>(lines, v, b, a, offsets, acc),
                                ($t, false) => simd::pass::<$t, false>(lines, v, b, a, offsets, acc),
                            )*
                            (rows, _) => unreachable!("{rows} rows in a pass"),
                        }
                    };
                }
                    pass!(1 2 3 4 5 6 7 8);
                }
            }
            // Chunks start at multiples of 16; a group may end past its chunk (`set_run`
            // stops at the chunk's end).
            let r0 = g * ROWS;
            assert!(r0 >= range.start);
            for (i, &t) in rows.iter().enumerate() {
                out.set_run(t, r0, &acc[i * ROWS..(i + 1) * ROWS]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{Q8KRow, LINES, QK_K, ROWS, SCALES};
    use crate::quant::act_tile::Line;
    use crate::quant::q6k_lanes::simd::sub_block;

    /// A super-block's values (its `lines`) unpacked into `values`: vector `4j + c` of
    /// sub-block `j` in `values[4j + c]`.
    ///
    /// # Safety
    /// AVX-512F and BW must be available; `lines` is one super-block's.
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    pub(super) unsafe fn unpack(lines: &[Line], values: &mut [Line; QK_K / 4]) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            assert!(lines.len() >= LINES);
            for j in 0..16 {
                for (c, v) in sub_block(lines.as_ptr(), j).into_iter().enumerate() {
                    _mm512_storeu_si512(values[4 * j + c].0.as_mut_ptr() as *mut __m512i, v);
                }
            }
        }
    }

    /// Super-block `b` (its `lines`; with `UNPACKED` its values already unpacked in
    /// `values`, otherwise unpacked here) of a group's sixteen rows against activation
    /// rows `a[..T]`, added to their sums `acc[16t..16t + 16]`.
    ///
    /// # Safety
    /// AVX-512 (F, VL, BW) and VNNI must be available; `lines` is one super-block's,
    /// `a` and `offsets` hold at least `T` rows covering super-block `b`, `acc` at least
    /// `16T` values.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vnni,avx512vl,avx512bw")]
    pub(super) unsafe fn pass<const T: usize, const UNPACKED: bool>(
        lines: &[Line],
        values: &[Line; QK_K / 4],
        b: usize,
        a: &[&Q8KRow],
        offsets: &[&[i32]],
        acc: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            assert!(a.len() >= T && offsets.len() >= T && acc.len() >= T * ROWS);
            assert!(lines.len() >= LINES);
            let zero = _mm512_setzero_si512();
            let mut s1 = [zero; T];
            for s in 0..16 {
                let mut raw = [zero; T];
                for (raw, offsets) in raw.iter_mut().zip(offsets) {
                    *raw = _mm512_set1_epi32(*offsets.get_unchecked(16 * b + s));
                }
                let sub_block = match UNPACKED {
                    true => std::array::from_fn(|c| {
                        _mm512_load_si512(values[4 * s + c].0.as_ptr() as *const __m512i)
                    }),
                    false => sub_block(lines.as_ptr(), s),
                };
                for (c, &codes) in sub_block.iter().enumerate() {
                    for (raw, a) in raw.iter_mut().zip(a) {
                        let at = a.qs.as_ptr().add(b * QK_K + 16 * s + 4 * c);
                        let four = _mm512_set1_epi32((at as *const i32).read_unaligned());
                        *raw = _mm512_dpbusd_epi32(*raw, codes, four);
                    }
                }
                let scales = lines
                    .get_unchecked(SCALES + s / 4)
                    .0
                    .as_ptr()
                    .add(16 * (s % 4));
                let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(scales as *const __m128i));
                for (s1, raw) in s1.iter_mut().zip(&raw) {
                    *s1 = _mm512_add_epi32(*s1, _mm512_mullo_epi32(*raw, scale));
                }
            }
            let d = _mm512_loadu_ps(lines[0].0.as_ptr() as *const f32);
            for (t, s1) in s1.iter().enumerate() {
                let d1 = _mm512_set1_ps(*a.get_unchecked(t).d.get_unchecked(b));
                let result = _mm512_mul_ps(_mm512_cvtepi32_ps(*s1), d);
                let sum = acc.as_mut_ptr().add(ROWS * t);
                _mm512_storeu_ps(sum, _mm512_fmadd_ps(result, d1, _mm512_loadu_ps(sum)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::formats::q6_k;
    use crate::quant::output::Output;
    use crate::quant::pair_lanes::SumsOnce;
    use crate::quant::q8k::quantize_row_q8k;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::{OwnFormat, RowKernel};

    /// Every row (a ragged last group) against eleven activation rows (a full pass and a
    /// ragged one, one of them left out), and against five, equals the portable tiled dot
    /// product bit for bit.
    #[test]
    fn tiled_kernel_is_bit_identical_to_the_portable_one() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run.
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        let mut rng = Xorshift::new(29);
        let (rows, cols, n) = (37, 3 * QK_K, 12);
        let raw = sample::weights(OwnFormat::Q6_K, rows, cols, &mut rng);
        let m = Q6kLanes::new(&raw, rows, cols / QK_K);
        let acts: Vec<Q8KRow> = (0..n)
            .map(|t| {
                let scale = [4.0, 0.01, 300.0, 1.0][t % 4];
                quantize_row_q8k(
                    &sample::activations(1, cols, scale, &mut rng),
                    RowKernel::Gemv,
                )
            })
            .collect();
        let once = SumsOnce::default();
        let offsets = once.q6k_offsets(&acts);
        // Eleven rows (two passes over unpacked values) and five (one pass, unpacking as
        // it goes).
        for wide in [(1..n).collect::<Vec<usize>>(), vec![1, 2, 5, 8, 11]] {
            let mut got = vec![f32::NAN; n * rows];
            let output = Output::new(&mut got, n, rows);
            for start in (0..rows).step_by(32) {
                let range = start..(start + 32).min(rows);
                // SAFETY: disjoint ranges, one at a time; VNNI was checked.
                unsafe {
                    let columns = output.columns(range.clone());
                    chunk(&m, &acts, offsets, &wide, range, &columns);
                }
            }
            let row_bytes = cols / QK_K * q6_k::BYTES;
            for r in 0..rows {
                let w = &raw[r * row_bytes..][..row_bytes];
                for t in 0..n {
                    let got = got[t * rows + r];
                    if !wide.contains(&t) {
                        assert!(got.is_nan(), "row {t} was left out");
                        continue;
                    }
                    let want = q6_k::dot_tiled(w, &acts[t]);
                    assert_eq!(
                        want.to_bits(),
                        got.to_bits(),
                        "row {r} act {t}: {want} against {got}"
                    );
                }
            }
        }
    }
}
