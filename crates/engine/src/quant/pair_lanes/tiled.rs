//! The two-row layout's kernel for micro-batches of 8 or more activation rows, with the
//! arithmetic of llama.cpp's tiled matmul (`ggml-cpu/tiled`, its AVX-512 VNNI
//! microkernel), which llama.cpp takes for such a matmul of Q5_K or IQ4_XS weights: per
//! super-block one exact integer sum of the scaled sub-block products (and of the minimum
//! terms), one float result, added times the activation's scale to a running sum. The
//! portable twins are `crate::quant::formats::q5_k::dot_tiled` and `crate::quant::formats::iq4_xs::dot_tiled`.
//!
//! Where the one-row kernel keeps eight lanes per row and scales every `vpdpbusd`, this one
//! puts sixteen weight rows in a vector's lanes (four bytes each) and broadcasts four
//! activation bytes: eight `vpdpbusd` take a sub-block of 32 for sixteen rows, and one
//! multiplication by the rows' scales ends it. The rows are decoded from the two-row lines
//! into such a tile once per super-block and used for every activation row.

use std::ops::Range;

use super::{LaneSums, PairLane, PairLanes};
use crate::quant::act_tile::Line;
use crate::quant::iq4;
use crate::quant::output::Columns;
use crate::quant::q8k::Q8KRow;
use crate::quant::q8k::QK_K;

/// Weight rows per group: one per 32-bit lane of a 512-bit vector.
use crate::simd::LANES_512 as ROWS;
/// Activation rows per pass over a tile's super-block.
const PASS: usize = 8;

/// Sixteen rows' super-block, decoded for the kernel.
#[repr(C, align(64))]
struct Tile {
    /// Group `g` (values `4(g % 8)..4(g % 8) + 4` of sub-block `g / 8`): per row (lane) its
    /// four values as unsigned bytes (IQ4_XS's table values 128 higher).
    codes: [Line; 64],
    /// Per sub-block, the rows' scales (IQ4_XS's signed).
    scales: [[i32; ROWS]; 8],
    /// Per pair of sub-blocks `2i, 2i + 1`, the rows' two minimums (Q5_K) or two scales
    /// (IQ4_XS) as 16-bit halves of a lane.
    pairs: [[i32; ROWS]; 4],
    /// The rows' `d`.
    d: [f32; ROWS],
    /// The rows' `dmin` (Q5_K).
    dmin: [f32; ROWS],
}

impl Tile {
    fn new() -> Box<Self> {
        Box::new(Self {
            codes: [Line([0; 64]); 64],
            scales: [[0; ROWS]; 8],
            pairs: [[0; ROWS]; 4],
            d: [0.0; ROWS],
            dmin: [0.0; ROWS],
        })
    }

    /// Decodes super-block `b` of rows `r0..r0 + 16` (zeros past the matrix's pairs).
    fn decode<F: PairLane>(&mut self, m: &PairLanes<F>, r0: usize, b: usize) {
        let per = F::LINES;
        for i in 0..ROWS {
            let (p, h) = ((r0 + i) / 2, (r0 + i) % 2);
            if p >= m.rows.div_ceil(2) {
                for g in 0..64 {
                    self.codes[g].0[4 * i..4 * i + 4].fill(0);
                }
                for s in 0..8 {
                    self.scales[s][i] = 0;
                }
                for pair in &mut self.pairs {
                    pair[i] = 0;
                }
                (self.d[i], self.dmin[i]) = (0.0, 0.0);
                continue;
            }
            let lines = &m.pair(p)[b * per..(b + 1) * per];
            let head = &lines[0].0;
            let f32_at = |at: usize| f32::from_le_bytes(head[at..at + 4].try_into().unwrap());
            self.d[i] = f32_at(4 * h);
            self.dmin[i] = match F::FIVE_BITS {
                true => f32_at(8 + 4 * h),
                false => 0.0,
            };
            let mut second = [0i32; 8];
            for s in 0..8 {
                let byte = head[16 + 8 * h + s];
                self.scales[s][i] = match F::FIVE_BITS {
                    true => byte as i32,
                    false => byte as i8 as i32,
                };
                second[s] = match F::FIVE_BITS {
                    true => {
                        let at = 32 + 16 * h + 2 * s;
                        i16::from_le_bytes([head[at], head[at + 1]]) as i32
                    }
                    false => self.scales[s][i],
                };
            }
            for (k, pair) in self.pairs.iter_mut().enumerate() {
                pair[i] = (second[2 * k] & 0xFFFF) | (second[2 * k + 1] << 16);
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::simd::vnni() {
            // SAFETY: AVX-512 VNNI was checked.
            unsafe { simd::decode_codes(m, r0, b, &mut self.codes) };
            return;
        }
        self.decode_codes(m, r0, b);
    }

    /// The codes of [`Tile::decode`] in portable code.
    fn decode_codes<F: PairLane>(&mut self, m: &PairLanes<F>, r0: usize, b: usize) {
        let per = F::LINES;
        let table: [u8; 16] = iq4::VALUES.map(|v| (v as i32 + 128) as u8);
        for i in 0..ROWS {
            let (p, h) = ((r0 + i) / 2, (r0 + i) % 2);
            if p >= m.rows.div_ceil(2) {
                continue;
            }
            let lines = &m.pair(p)[b * per..(b + 1) * per];
            for s in 0..8 {
                let nibbles = &lines[1 + s / 2].0[32 * h..32 * h + 32];
                for (k, &byte) in nibbles.iter().enumerate() {
                    let index = (byte >> (4 * (s % 2))) & 0x0F;
                    let code = match F::FIVE_BITS {
                        true => index | (((lines[5].0[32 * h + k] >> s) & 1) << 4),
                        false => table[index as usize],
                    };
                    self.codes[8 * s + k / 4].0[4 * i + k % 4] = code;
                }
            }
        }
    }
}

/// Output features `range` of `m` (a multiple of 16 from its start) for activation rows
/// `rows` of `a`, in tiles of sixteen weight rows.
///
/// # Safety
/// AVX-512 (F, VL, BW) and VNNI must be available.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn chunk<F: PairLane>(
    m: &PairLanes<F>,
    a: &[Q8KRow],
    sums: &[LaneSums],
    rows: &[usize],
    range: Range<usize>,
    out: &Columns,
) {
    // SAFETY: the caller upholds this function's safety contract, all that
    // these operations need.
    unsafe {
        // Tiles start at even rows: the vector decode takes whole pairs.
        assert!(range.start.is_multiple_of(ROWS));
        let a: Vec<&Q8KRow> = rows.iter().map(|&t| &a[t]).collect();
        let sums: Vec<&LaneSums> = rows.iter().map(|&t| &sums[t]).collect();
        assert!(a.iter().all(|row| row.has_blocks(m.blocks)));
        assert!(sums.iter().all(|s| s.pairs.len() >= m.blocks * 8));
        let n = rows.len();
        let mut tile = Tile::new();
        let mut acc = vec![0f32; n * ROWS];
        for r0 in range.clone().step_by(ROWS) {
            acc.fill(0.0);
            for b in 0..m.blocks {
                tile.decode(m, r0, b);
                for t0 in (0..n).step_by(PASS) {
                    let (a, sums) = (&a[t0..], &sums[t0..]);
                    let acc = &mut acc[t0 * ROWS..];
                    match (n - t0).min(PASS) {
                        1 => simd::pass::<1, F>(&tile, b, a, sums, acc),
                        2 => simd::pass::<2, F>(&tile, b, a, sums, acc),
                        3 => simd::pass::<3, F>(&tile, b, a, sums, acc),
                        4 => simd::pass::<4, F>(&tile, b, a, sums, acc),
                        5 => simd::pass::<5, F>(&tile, b, a, sums, acc),
                        6 => simd::pass::<6, F>(&tile, b, a, sums, acc),
                        7 => simd::pass::<7, F>(&tile, b, a, sums, acc),
                        _ => simd::pass::<8, F>(&tile, b, a, sums, acc),
                    }
                }
            }
            for (i, &t) in rows.iter().enumerate() {
                out.set_run(t, r0, &acc[i * ROWS..(i + 1) * ROWS]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{iq4, LaneSums, Line, PairLane, PairLanes, Q8KRow, Tile, QK_K, ROWS};

    /// [`Tile::decode`]'s codes: per sub-block, each pair's 64 values decoded in one
    /// vector (the first row's 32, then the second's), then the eight vectors transposed
    /// so that each holds four values of every row.
    ///
    /// # Safety
    /// AVX-512 (F, VL, BW) must be available.
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw")]
    pub(super) unsafe fn decode_codes<F: PairLane>(
        m: &PairLanes<F>,
        r0: usize,
        b: usize,
        codes: &mut [Line; 64],
    ) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            let (per, pairs) = (F::LINES, m.rows.div_ceil(2));
            let low = _mm512_set1_epi8(0x0F);
            let bit4 = _mm512_set1_epi8(0x10);
            let table: [u8; 16] = iq4::VALUES.map(|v| (v as i32 + 128) as u8);
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr() as *const __m128i));
            // Dword c of the first row next to dword c of the second: qword c holds both.
            let interleave =
                _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
            let p0 = r0 / 2;
            for s in 0..8 {
                let mut x = [_mm512_setzero_si512(); 8];
                for (q, x) in x.iter_mut().enumerate() {
                    if p0 + q >= pairs {
                        continue;
                    }
                    let lines = m.pair(p0 + q).as_ptr().add(b * per);
                    let v = _mm512_load_si512(lines.add(1 + s / 2) as *const __m512i);
                    let index = match s % 2 {
                        0 => _mm512_and_si512(v, low),
                        _ => _mm512_and_si512(_mm512_srli_epi16::<4>(v), low),
                    };
                    let values = match F::FIVE_BITS {
                        true => {
                            let qh = _mm512_load_si512(lines.add(5) as *const __m512i);
                            // Bit s of each qh byte moved to bit 4 (16-bit shifts: bit 4 of a
                            // byte comes from the same byte for shifts of at most four).
                            let high = match s <= 4 {
                                true => _mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - s as i32)),
                                false => _mm512_srl_epi16(qh, _mm_cvtsi32_si128(s as i32 - 4)),
                            };
                            _mm512_ternarylogic_epi32::<0xF8>(index, high, bit4)
                        }
                        false => _mm512_shuffle_epi8(table, index),
                    };
                    *x = _mm512_permutexvar_epi32(interleave, values);
                }
                // An 8 × 8 transpose of qwords (pair q, group c), one bit of the indices at a
                // time: afterwards vector c holds group c of pairs 0..8.
                for k in 0..3 {
                    let stride = 1 << k;
                    let keep: [i64; 8] = std::array::from_fn(|c| match c & stride {
                        0 => c as i64,
                        _ => 8 + (c - stride) as i64,
                    });
                    let take: [i64; 8] = std::array::from_fn(|c| match c & stride {
                        0 => (c + stride) as i64,
                        _ => 8 + c as i64,
                    });
                    let keep = _mm512_loadu_si512(keep.as_ptr() as *const __m512i);
                    let take = _mm512_loadu_si512(take.as_ptr() as *const __m512i);
                    for q in (0..8).filter(|q| q & stride == 0) {
                        let (lo, hi) = (x[q], x[q + stride]);
                        x[q] = _mm512_permutex2var_epi64(lo, keep, hi);
                        x[q + stride] = _mm512_permutex2var_epi64(lo, take, hi);
                    }
                }
                for (c, x) in x.iter().enumerate() {
                    _mm512_store_si512(codes[8 * s + c].0.as_mut_ptr() as *mut __m512i, *x);
                }
            }
        }
    }

    /// Super-block `b` of the tile's sixteen rows against activation rows `a[..T]`, added
    /// to their sums `acc[16t..16t + 16]`.
    ///
    /// # Safety
    /// AVX-512 (F, VL, BW) and VNNI must be available; `a` and `sums` hold at least `T`
    /// rows covering super-block `b`, `acc` at least `16T` values.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vnni,avx512vl,avx512bw")]
    pub(super) unsafe fn pass<const T: usize, F: PairLane>(
        tile: &Tile,
        b: usize,
        a: &[&Q8KRow],
        sums: &[&LaneSums],
        acc: &mut [f32],
    ) {
        // SAFETY: the caller upholds this function's safety contract, all that
        // these operations need.
        unsafe {
            assert!(a.len() >= T && sums.len() >= T && acc.len() >= T * ROWS);
            let zero = _mm512_setzero_si512();
            let mut s1 = [zero; T];
            for s in 0..8 {
                let mut raw = [zero; T];
                for c in 0..8 {
                    let codes =
                        _mm512_load_si512(tile.codes[8 * s + c].0.as_ptr() as *const __m512i);
                    for (raw, a) in raw.iter_mut().zip(a) {
                        let at = a.qs.as_ptr().add(b * QK_K + 32 * s + 4 * c);
                        let four = _mm512_set1_epi32((at as *const i32).read_unaligned());
                        *raw = _mm512_dpbusd_epi32(*raw, codes, four);
                    }
                }
                let scale = _mm512_loadu_si512(tile.scales[s].as_ptr() as *const __m512i);
                for t in 0..T {
                    s1[t] = _mm512_add_epi32(s1[t], _mm512_mullo_epi32(raw[t], scale));
                }
            }
            // Per activation row, the sums of its eight sub-blocks as 16-bit pairs, against the
            // rows' minimums (Q5_K: s2) or scales (IQ4_XS: the table's offset, 128 times it).
            let mut s2 = [zero; T];
            for k in 0..4 {
                let pair = _mm512_loadu_si512(tile.pairs[k].as_ptr() as *const __m512i);
                for (s2, sums) in s2.iter_mut().zip(sums) {
                    let at = sums.pairs.as_ptr().add(8 * b + 2 * k);
                    let sums = _mm512_set1_epi32((at as *const i32).read_unaligned());
                    *s2 = _mm512_dpwssd_epi32(*s2, pair, sums);
                }
            }
            let d = _mm512_loadu_ps(tile.d.as_ptr());
            let dmin = _mm512_loadu_ps(tile.dmin.as_ptr());
            for t in 0..T {
                let d1 = _mm512_set1_ps(*a.get_unchecked(t).d.get_unchecked(b));
                let result = match F::FIVE_BITS {
                    true => {
                        let f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(s1[t]), d);
                        _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(s2[t]), f1)
                    }
                    false => {
                        let exact = _mm512_sub_epi32(s1[t], _mm512_slli_epi32::<7>(s2[t]));
                        _mm512_mul_ps(_mm512_cvtepi32_ps(exact), d)
                    }
                };
                let sum = acc.as_mut_ptr().add(ROWS * t);
                _mm512_storeu_ps(sum, _mm512_fmadd_ps(result, d1, _mm512_loadu_ps(sum)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::formats::iq4_xs::{self, Iq4Xs};
    use crate::quant::formats::q5_k::{self, Q5K};
    use crate::quant::output::Output;
    use crate::quant::q8k::quantize_row_q8k;
    use crate::quant::sample::{self, Xorshift};
    use crate::quant::{OwnFormat, RowKernel};

    /// The vector decoding of a tile's codes equals the portable one, for a full tile and
    /// for the ragged last one.
    #[test]
    fn codes_decode_alike_in_both_ways() {
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        let mut rng = Xorshift::new(5);
        codes_alike::<Q5K>(OwnFormat::Q5_K, &mut rng);
        codes_alike::<Iq4Xs>(OwnFormat::IQ4_XS, &mut rng);
    }

    /// [`codes_decode_alike_in_both_ways`] for `F` (random blocks of `own`).
    fn codes_alike<F: PairLane>(own: &OwnFormat, rng: &mut Xorshift) {
        let (rows, cols) = (21, 2 * QK_K);
        let raw = sample::weights(own, rows, cols, rng);
        let m = PairLanes::<F>::new(&raw, rows, cols / QK_K);
        for (r0, b) in [(0, 0), (16, 1)] {
            let (mut simd, mut portable) = (Tile::new(), Tile::new());
            // The portable decode alone, over a tile whose pairs past the matrix are
            // zero (as `decode` leaves them) and whose other bytes start as garbage.
            portable.codes = [Line([0xAA; 64]); 64];
            for i in 0..ROWS {
                if (r0 + i) / 2 >= rows.div_ceil(2) {
                    for g in 0..64 {
                        portable.codes[g].0[4 * i..4 * i + 4].fill(0);
                    }
                }
            }
            portable.decode_codes(&m, r0, b);
            // SAFETY: VNNI was checked.
            unsafe { simd::decode_codes(&m, r0, b, &mut simd.codes) };
            for g in 0..64 {
                let name = F::NAME;
                assert_eq!(simd.codes[g].0, portable.codes[g].0, "{name} {r0} {b} {g}");
            }
        }
    }

    /// Every row of both formats (an odd number, so the last tile is ragged and its last
    /// pair half empty) against eleven activation rows, every third left out (a full pass
    /// and a ragged one)
    /// equals the portable tiled dot product bit for bit.
    #[test]
    fn tiled_kernel_is_bit_identical_to_the_portable_one() {
        // Whatever FERRITE_CPU says: this compares the kernel the CPU can run.
        if crate::simd::cpu::lacks(crate::simd::cpu::detected().vnni, "vnni") {
            return;
        }
        let mut rng = Xorshift::new(23);
        tiled_alike::<Q5K>(OwnFormat::Q5_K, q5_k::dot_tiled, &mut rng);
        tiled_alike::<Iq4Xs>(OwnFormat::IQ4_XS, iq4_xs::dot_tiled, &mut rng);
    }

    /// [`tiled_kernel_is_bit_identical_to_the_portable_one`] for `F` (random blocks of
    /// `own`), whose portable tiled product is `dot`.
    fn tiled_alike<F: PairLane>(
        own: &OwnFormat,
        dot: fn(&[u8], &Q8KRow) -> f32,
        rng: &mut Xorshift,
    ) {
        let (rows, cols, n) = (37, 3 * QK_K, 11);
        let raw = sample::weights(own, rows, cols, rng);
        let m = PairLanes::<F>::new(&raw, rows, cols / QK_K);
        // Large and tiny activations too, so that the sums reach their extremes.
        let acts: Vec<Q8KRow> = (0..n)
            .map(|t| {
                let scale = [4.0, 0.01, 300.0, 1.0][t % 4];
                quantize_row_q8k(&sample::activations(1, cols, scale, rng), RowKernel::Gemv)
            })
            .collect();
        let sums: Vec<LaneSums> = acts.iter().map(LaneSums::new::<F>).collect();
        let mut got = vec![f32::NAN; n * rows];
        let output = Output::new(&mut got, n, rows);
        for start in (0..rows).step_by(32) {
            // SAFETY: disjoint ranges, one at a time; VNNI was checked.
            unsafe {
                let columns = output.columns(start..(start + 32).min(rows));
                // Rows with gaps: the left-out ones must stay untouched.
                let some: Vec<usize> = (0..n).filter(|t| t % 3 != 1).collect();
                chunk(
                    &m,
                    &acts,
                    &sums,
                    &some,
                    start..(start + 32).min(rows),
                    &columns,
                );
            }
        }
        let row_bytes = own.row_bytes(cols);
        for r in 0..rows {
            let w = &raw[r * row_bytes..][..row_bytes];
            for (t, a) in acts.iter().enumerate() {
                if t % 3 == 1 {
                    assert!(got[t * rows + r].is_nan(), "row {r} act {t} was left out");
                    continue;
                }
                let want = dot(w, a);
                assert_eq!(
                    want.to_bits(),
                    got[t * rows + r].to_bits(),
                    "{} row {r} act {t}: {want} against {}",
                    F::NAME,
                    got[t * rows + r]
                );
            }
        }
    }
}
