//! K-quant kernels (Q4_K, Q6_K) against Q8_K activations, in the arithmetic llama.cpp
//! uses on x86. Q4_K follows its repacked 8×8 kernels: the GEMV (one row alone: one fused
//! multiply-add per super-block) or the GEMM (a group of four prompt rows: one per pair of
//! sub-blocks, and activations quantized by `quantize_mat_q8_K_4x8`). Q3_K, Q5_K and Q6_K
//! follow its AVX2 dot product (eight lanes, summed as `hsum_float_8`) for rows of
//! micro-batches under 8, and its tiled matmul (`dot_*_tiled`) for wider ones.

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::RowKernel;
use crate::simd::convert::f16_at;
use crate::simd::reduce::hsum8;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of a Q4_K super-block: d, dmin, 12 packed 6-bit scales/mins, 128 nibble bytes.
pub const Q4_K: usize = 144;
/// Bytes of a Q6_K super-block: 128 low-nibble bytes, 64 high-bit bytes, 16 scales, d.
pub const Q6_K: usize = 210;
/// Bytes per Q5_K super-block.
pub const Q5_K: usize = 176;
/// Bytes per Q3_K super-block.
pub const Q3_K: usize = 110;
/// Bytes per Q2_K super-block.
pub const Q2_K: usize = 84;

/// One row of activations quantized to Q8_K super-blocks.
pub struct Q8KRow {
    /// Per super-block scale.
    pub d: Vec<f32>,
    /// Quantized values.
    pub qs: Vec<i8>,
    /// Per 16 values: their sum.
    pub bsums: Vec<i32>,
}

impl Q8KRow {
    /// Whether the row holds at least `blocks` super-blocks (values, scales and sums).
    pub fn has_blocks(&self, blocks: usize) -> bool {
        self.d.len() >= blocks && self.qs.len() >= blocks * QK_K && self.bsums.len() >= blocks * 16
    }
}

/// Quantizes a row (length a multiple of 256) as ggml does for `kernel`: the scale comes
/// from the value of largest magnitude, values are rounded half to even. When +m and -m
/// both have the largest magnitude, `quantize_row_q8_K_ref` (GEMV) takes the first one and
/// `quantize_mat_q8_K_4x8` (GEMM) the positive one.
pub fn quantize_row_q8k(x: &[f32], kernel: RowKernel) -> Q8KRow {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2() {
        // SAFETY: AVX2, FMA and F16C are available.
        return unsafe { avx2::quantize_row_q8k(x, kernel) };
    }
    quantize_row_q8k_portable(x, kernel)
}

/// [`quantize_row_q8k`] in portable code.
pub fn quantize_row_q8k_portable(x: &[f32], kernel: RowKernel) -> Q8KRow {
    let blocks = x.len() / QK_K;
    let mut row = Q8KRow {
        d: Vec::with_capacity(blocks),
        qs: vec![0; x.len()],
        bsums: vec![0; blocks * 16],
    };
    for (b, block) in x.chunks_exact(QK_K).enumerate() {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in block {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            row.d.push(0.0);
            continue;
        }
        if kernel.in_group_of_four() && max < 0.0 && block.contains(&amax) {
            max = amax;
        }
        let iscale = -127.0 / max;
        let qs = &mut row.qs[b * QK_K..(b + 1) * QK_K];
        for (q, &v) in qs.iter_mut().zip(block) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (g, sum) in row.bsums[b * 16..(b + 1) * 16].iter_mut().enumerate() {
            *sum = qs[g * 16..(g + 1) * 16].iter().map(|&q| q as i32).sum();
        }
        row.d.push(1.0 / iscale);
    }
    row
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) of a Q4_K super-block.
pub(super) fn scale_min_k4(j: usize, s: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((s[j] & 63) as i32, (s[j + 4] & 63) as i32)
    } else {
        (
            ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4)) as i32,
            ((s[j + 4] >> 4) | ((s[j] >> 6) << 4)) as i32,
        )
    }
}

/// The floating-point side of a Q4_K dot product: the GEMV folds a super-block's integer
/// sums into one fused multiply-add, the GEMM each pair of sub-blocks'. Shared by the
/// portable and SIMD kernels so that both round alike.
pub(super) struct Q4kSums {
    per_pair: bool,
    acc: f32,
    acc_min: f32,
    isum: i32,
    imin: i32,
}

impl Q4kSums {
    /// Empty sums for `kernel`.
    pub(super) fn new(kernel: RowKernel) -> Self {
        Self {
            per_pair: kernel.in_group_of_four(),
            acc: 0.0,
            acc_min: 0.0,
            isum: 0,
            imin: 0,
        }
    }

    /// Adds a pair of sub-blocks' scaled dot product and scaled minimum term; `dd` and `dm`
    /// are the super-block's `d` and `dmin` times the activations' scale.
    pub(super) fn pair(&mut self, psum: i32, pmin: i32, dd: f32, dm: f32) {
        if self.per_pair {
            self.acc = (psum as f32).mul_add(dd, self.acc);
            self.acc_min = (pmin as f32).mul_add(dm, self.acc_min);
        } else {
            self.isum += psum;
            self.imin += pmin;
        }
    }

    /// Ends a super-block.
    pub(super) fn end_block(&mut self, dd: f32, dm: f32) {
        if !self.per_pair {
            self.acc = (self.isum as f32).mul_add(dd, self.acc);
            self.acc_min = (self.imin as f32).mul_add(dm, self.acc_min);
            (self.isum, self.imin) = (0, 0);
        }
    }

    /// The dot product.
    pub(super) fn result(&self) -> f32 {
        self.acc - self.acc_min
    }
}

/// Evaluates `$call` with the constant `$N` set to `$n` (zero to four) and copies its `$N`
/// results into the front of `$out`.
#[cfg(target_arch = "x86_64")]
macro_rules! with_row_count {
    ($n:expr, $out:ident, $N:ident => $call:expr) => {
        match $n {
            0 => {}
            1 => {
                const $N: usize = 1;
                $out[..$N].copy_from_slice(&$call);
            }
            2 => {
                const $N: usize = 2;
                $out[..$N].copy_from_slice(&$call);
            }
            3 => {
                const $N: usize = 3;
                $out[..$N].copy_from_slice(&$call);
            }
            4 => {
                const $N: usize = 4;
                $out[..$N].copy_from_slice(&$call);
            }
            n => unreachable!("{n} rows: at most four at a time"),
        }
    };
}

/// For the lane kernels' tests: `$($dot)::+::<T>($lead.., rows, per_row, soon)` for the
/// one to four activation rows `$a`, each with its entry of `$s` (a lane start or a row
/// kernel), `T` their count; the results as a vector.
#[cfg(all(test, target_arch = "x86_64"))]
macro_rules! by_row_count {
    ($($dot:ident)::+, ($($lead:expr),+), $soon:expr, $a:expr, $s:expr) => {{
        let (a, s, soon) = ($a, $s, $soon);
        match a.len() {
            1 => $($dot)::+::<1>($($lead),+, [a[0]], [s[0]], soon).to_vec(),
            2 => $($dot)::+::<2>($($lead),+, [a[0], a[1]], [s[0], s[1]], soon).to_vec(),
            3 => $($dot)::+::<3>($($lead),+, [a[0], a[1], a[2]], [s[0], s[1], s[2]], soon)
                .to_vec(),
            _ => $($dot)::+::<4>(
                $($lead),+,
                [a[0], a[1], a[2], a[3]],
                [s[0], s[1], s[2], s[3]],
                soon,
            )
            .to_vec(),
        }
    }};
}

/// Q4_K dot products of one weight row with up to four activation rows, each rounded as
/// its kernel says (entries past the given rows are zero), in portable code: CPUs with
/// AVX2 take the interleaved layout's kernels (`q4k_lanes`) instead.
pub fn dot_q4k_tile(w: &[u8], a: &[&Q8KRow], kernels: &[RowKernel]) -> [f32; 4] {
    assert!(a.len() <= 4 && kernels.len() == a.len());
    let mut out = [0f32; 4];
    for (r, (a, &kernel)) in a.iter().zip(kernels).enumerate() {
        out[r] = dot_q4k_portable(w, a, kernel);
    }
    out
}

/// Q6_K dot products of one weight row with up to four activation rows (entries past the
/// given rows are zero), in portable code: CPUs with AVX2 take the interleaved layout's
/// kernels (`q6k_lanes`) instead.
pub fn dot_q6k_tile(w: &[u8], a: &[&Q8KRow], tiled: bool) -> [f32; 4] {
    assert!(a.len() <= 4);
    let mut out = [0f32; 4];
    for (r, a) in a.iter().enumerate() {
        out[r] = match tiled {
            true => dot_q6k_tiled(w, a),
            false => dot_q6k_portable(w, a),
        };
    }
    out
}

/// The dot product of a Q4_K weight row with a Q8_K activation row, rounded as `kernel`, in
/// portable code.
pub fn dot_q4k_portable(w: &[u8], a: &Q8KRow, kernel: RowKernel) -> f32 {
    let mut sums = Q4kSums::new(kernel);
    for (b, block) in w.chunks_exact(Q4_K).enumerate() {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let scales = &block[4..16];
        let qs = &block[16..144];
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &a.bsums[b * 16..(b + 1) * 16];
        let (dd, dm) = (d * a.d[b], dmin * a.d[b]);
        for pair in 0..4 {
            let (mut psum, mut pmin) = (0i32, 0i32);
            for half in 0..2 {
                let j = pair * 2 + half;
                let (sc, m) = scale_min_k4(j, scales);
                let mut dot = 0i32;
                for l in 0..32 {
                    let byte = qs[pair * 32 + l];
                    let q = if half == 0 { byte & 0x0F } else { byte >> 4 } as i32;
                    dot += q * q8[j * 32 + l] as i32;
                }
                psum += sc * dot;
                pmin += m * (bsums[2 * j] + bsums[2 * j + 1]);
            }
            sums.pair(psum, pmin, dd, dm);
        }
        sums.end_block(dd, dm);
    }
    sums.result()
}

/// The dot product of a Q6_K weight row with a Q8_K activation row, in portable code.
pub fn dot_q6k_portable(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in w.chunks_exact(Q6_K).enumerate() {
        let ql = &block[0..128];
        let qh = &block[128..192];
        let sc: Vec<i32> = block[192..208].iter().map(|&s| s as i8 as i32).collect();
        let d = a.d[b] * f16_at(block, 208);
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &a.bsums[b * 16..(b + 1) * 16];
        let mut lanes = [0i32; 8];
        for j in 0..2 {
            let (ql, qh) = (&ql[64 * j..64 * j + 64], &qh[32 * j..32 * j + 32]);
            for v in 0..4 {
                for e in 0..32 {
                    let (lo, hi) = match v {
                        0 => (ql[e] & 0x0F, qh[e] & 3),
                        1 => (ql[e + 32] & 0x0F, (qh[e] >> 2) & 3),
                        2 => (ql[e] >> 4, (qh[e] >> 4) & 3),
                        _ => (ql[e + 32] >> 4, (qh[e] >> 6) & 3),
                    };
                    let u = (lo | (hi << 4)) as i32;
                    let scale = sc[8 * j + 2 * v + usize::from(e >= 16)];
                    lanes[e / 4] += scale * u * q8[128 * j + 32 * v + e] as i32;
                }
            }
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane -= 32 * (bsums[2 * l] * sc[2 * l] + bsums[2 * l + 1] * sc[2 * l + 1]);
            acc[l] = d.mul_add(*lane as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

/// The 256 values of a Q6_K super-block in order, as unsigned 6-bit numbers (value + 32).
pub(super) fn q6k_values(block: &[u8]) -> [u8; QK_K] {
    let mut out = [0u8; QK_K];
    for half in 0..2 {
        let (ql, qh) = (&block[64 * half..][..64], &block[128 + 32 * half..][..32]);
        for e in 0..32 {
            let k = 128 * half + e;
            out[k] = (ql[e] & 0x0F) | ((qh[e] & 3) << 4);
            out[k + 32] = (ql[e + 32] & 0x0F) | (((qh[e] >> 2) & 3) << 4);
            out[k + 64] = (ql[e] >> 4) | (((qh[e] >> 4) & 3) << 4);
            out[k + 96] = (ql[e + 32] >> 4) | (((qh[e] >> 6) & 3) << 4);
        }
    }
    out
}

/// The dot product of a Q6_K weight row with a Q8_K activation row as llama.cpp's tiled
/// matmul computes it for 8 or more activation rows (see [`dot_q5k_tiled`]): per
/// super-block the scaled sums of its sixteen sub-blocks of 16 in exact integers, one
/// rounded product by `d`, added with a fused multiply-add times the activation's scale to
/// a running sum that starts at zero.
pub fn dot_q6k_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in w.chunks_exact(Q6_K).enumerate() {
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let values = q6k_values(block).map(|u| u as i32 - 32);
        let mut s1 = 0i32;
        for (s, &scale) in block[192..208].iter().enumerate() {
            let raw: i32 = (16 * s..16 * s + 16)
                .map(|k| values[k] * q8[k] as i32)
                .sum();
            s1 = s1.wrapping_add((scale as i8 as i32).wrapping_mul(raw));
        }
        acc = (s1 as f32 * f16_at(block, 208)).mul_add(a.d[b], acc);
    }
    acc
}

/// The dot product of a Q2_K weight row with a Q8_K activation row as llama.cpp computes
/// it once it has repacked the matrix eight rows at a time (x86 with AVX-512, rows a
/// multiple of eight): the integer sums of the scaled values and of the scaled minimums,
/// each folded into its own accumulator with one fused multiply-add, per super-block by
/// the GEMV and per half super-block by the four-row GEMM; the minimums' accumulator is
/// subtracted at the end.
pub fn dot_q2k_repacked(w: &[u8], a: &Q8KRow, kernel: RowKernel) -> f32 {
    let mut sums = Q4kSums::new(kernel);
    for (b, block) in w.chunks_exact(Q2_K).enumerate() {
        let scales = &block[0..16];
        let qs = &block[16..80];
        let (dd, dm) = (f16_at(block, 80) * a.d[b], f16_at(block, 82) * a.d[b]);
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &a.bsums[b * 16..(b + 1) * 16];
        for half in 0..2 {
            let (mut psum, mut pmin) = (0i32, 0i32);
            for shift in 0..4 {
                for part in 0..2 {
                    let j = 8 * half + 2 * shift + part;
                    let (sc, m) = ((scales[j] & 0x0F) as i32, (scales[j] >> 4) as i32);
                    let mut dot = 0i32;
                    for e in 16 * part..16 * part + 16 {
                        let q = ((qs[32 * half + e] >> (2 * shift)) & 3) as i32;
                        dot += q * q8[128 * half + 32 * shift + e] as i32;
                    }
                    psum += sc * dot;
                    pmin += m * bsums[j];
                }
            }
            sums.pair(psum, pmin, dd, dm);
        }
        sums.end_block(dd, dm);
    }
    sums.result()
}

/// Adds `scale` times each group of four `products` to its lane (lane `l` takes products
/// `4l..4l + 4`), as the x86 kernels' `madd` does.
#[inline]
fn add_lanes(lanes: &mut [i32; 8], products: &[i32; 32], scale: i32) {
    for (lane, four) in lanes.iter_mut().zip(products.chunks_exact(4)) {
        *lane += scale * (four[0] + four[1] + four[2] + four[3]);
    }
}

/// The sixteen signed 6-bit scales of a Q3_K super-block.
pub(super) fn q3k_scales(packed: &[u8]) -> [i32; 16] {
    let word = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().unwrap());
    let (a0, a1, a2) = (word(0), word(1), word(2));
    let (low, high) = (0x0f0f_0f0fu32, 0x0303_0303u32);
    let words = [
        (a0 & low) | ((a2 & high) << 4),
        (a1 & low) | (((a2 >> 2) & high) << 4),
        ((a0 >> 4) & low) | (((a2 >> 4) & high) << 4),
        ((a1 >> 4) & low) | (((a2 >> 6) & high) << 4),
    ];
    let mut out = [0i32; 16];
    for (i, w) in words.iter().enumerate() {
        for (k, b) in w.to_le_bytes().iter().enumerate() {
            out[4 * i + k] = *b as i32 - 32;
        }
    }
    out
}

/// The eight integer lanes of one Q3_K super-block times its activations `q8`, as
/// llama.cpp's x86 `ggml_vec_dot_q3_K_q8_K` sums them (exact, so their total is also the
/// tiled kernel's integer sum).
fn q3k_block_lanes(block: &[u8], q8: &[i8]) -> [i32; 8] {
    let hmask = &block[0..32];
    let qs = &block[32..96];
    let scales = q3k_scales(&block[96..108]);
    let mut lanes = [0i32; 8];
    for j in 0..2 {
        for c in 0..4 {
            let bit = 4 * j + c;
            let at = 128 * j + 32 * c;
            // Two sub-blocks of 16 with their own scales; exact integer sums.
            for half in 0..2 {
                let mut products = [0i32; 32];
                for e in 16 * half..16 * half + 16 {
                    let low = ((qs[32 * j + e] >> (2 * c)) & 3) as i32;
                    let high = 4 - 4 * ((hmask[e] >> bit) & 1) as i32;
                    products[e] = (low - high) * q8[at + e] as i32;
                }
                add_lanes(&mut lanes, &products, scales[at / 16 + half]);
            }
        }
    }
    lanes
}

/// The dot product of a Q3_K weight row with a Q8_K activation row, rounded as llama.cpp's
/// x86 `ggml_vec_dot_q3_K_q8_K` (Q3_K is not repacked there): eight integer lanes per
/// super-block folded into float lanes with one fused multiply-add by `d`, then
/// `hsum_float_8`.
pub fn dot_q3k_portable(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    for (b, block) in w.chunks_exact(Q3_K).enumerate() {
        let d = a.d[b] * f16_at(block, 108);
        let lanes = q3k_block_lanes(block, &a.qs[b * QK_K..(b + 1) * QK_K]);
        for (l, &lane) in lanes.iter().enumerate() {
            acc[l] = d.mul_add(lane as f32, acc[l]);
        }
    }
    hsum8(&acc)
}

/// The dot product of a Q3_K weight row with a Q8_K activation row as llama.cpp's tiled
/// matmul computes it for 8 or more activation rows (see [`dot_q5k_tiled`]): per
/// super-block the exact integer sum, one rounded product by `d`, added with a fused
/// multiply-add times the activation's scale to a running sum that starts at zero.
pub fn dot_q3k_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in w.chunks_exact(Q3_K).enumerate() {
        let lanes = q3k_block_lanes(block, &a.qs[b * QK_K..(b + 1) * QK_K]);
        let s1 = lanes.iter().fold(0i32, |s, &l| s.wrapping_add(l));
        acc = (s1 as f32 * f16_at(block, 108)).mul_add(a.d[b], acc);
    }
    acc
}

/// Q3_K dot products of one weight row with up to four activation rows (entries past the
/// given rows are zero), with the tiled kernel's arithmetic ([`dot_q3k_tiled`]) or the
/// one-row kernel's ([`dot_q3k_portable`]).
pub fn dot_q3k_tile(w: &[u8], a: &[&Q8KRow], tiled: bool) -> [f32; 4] {
    assert!(a.len() <= 4);
    let mut out = [0f32; 4];
    for (r, a) in a.iter().enumerate() {
        out[r] = match tiled {
            true => dot_q3k_tiled(w, a),
            false => dot_q3k_portable(w, a),
        };
    }
    out
}

/// Q5_K dot products of one weight row with up to four activation rows (entries past the
/// given rows are zero), with the tiled kernel's arithmetic ([`dot_q5k_tiled`]) or the
/// one-row kernel's ([`dot_q5k_portable`]).
pub fn dot_q5k_tile(w: &[u8], a: &[&Q8KRow], tiled: bool) -> [f32; 4] {
    assert!(a.len() <= 4);
    let mut out = [0f32; 4];
    for (r, a) in a.iter().enumerate() {
        out[r] = match tiled {
            true => dot_q5k_tiled(w, a),
            false => dot_q5k_portable(w, a),
        };
    }
    out
}

/// The dot product of a Q5_K weight row with a Q8_K activation row, rounded as llama.cpp's
/// x86 `ggml_vec_dot_q5_K_q8_K` (Q5_K is not repacked there): eight integer lanes per
/// super-block, each lane folded into its float accumulator with one fused multiply-add by
/// `d`, the minimums' integer sum folded into a scalar by another, and
/// `hsum(lanes) + minimums` at the end.
pub fn dot_q5k_portable(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = [0f32; 8];
    let mut mins = 0f32;
    for (b, block) in w.chunks_exact(Q5_K).enumerate() {
        let d = a.d[b] * f16_at(block, 0);
        let dmin = -a.d[b] * f16_at(block, 2);
        let scales = &block[4..16];
        let qh = &block[16..48];
        let qs = &block[48..176];
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &a.bsums[b * 16..(b + 1) * 16];
        let mut imin = 0i32;
        let mut lanes = [0i32; 8];
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, scales);
            imin += m * (bsums[2 * j] + bsums[2 * j + 1]);
            // Sub-block j: the low or high nibbles of 32 bytes, and bit j of each `qh` byte.
            // Integer sums are exact in any order: written so that the compiler vectorises.
            let bytes = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
            let q8 = &q8[j * 32..j * 32 + 32];
            let shift = 4 * (j % 2);
            let mut products = [0i32; 32];
            for e in 0..32 {
                let q = ((bytes[e] >> shift) & 0x0F) | (((qh[e] >> j) & 1) << 4);
                products[e] = q as i32 * q8[e] as i32;
            }
            add_lanes(&mut lanes, &products, sc);
        }
        mins = (imin as f32).mul_add(dmin, mins);
        for (l, &lane) in lanes.iter().enumerate() {
            acc[l] = d.mul_add(lane as f32, acc[l]);
        }
    }
    hsum8(&acc) + mins
}

/// The dot product of a Q5_K weight row with a Q8_K activation row as llama.cpp's tiled
/// matmul computes it (`ggml-cpu/tiled`, its AVX-512 VNNI microkernel), which it takes for
/// a matmul of 8 or more activation rows: per super-block the scaled sub-block sums and
/// the minimum terms in exact integers, one float result `s1·d − dmin·s2` (a fused
/// multiply-add after a rounded product), added with a fused multiply-add times the
/// activation's scale to a running sum that starts at zero. (llama.cpp writes that last step
/// as an add of a product; GCC, with its default `-ffp-contract=fast`, fuses it, and the
/// fixtures come from a GCC build. A build that did not fuse would round twice.)
pub fn dot_q5k_tiled(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0f32;
    for (b, block) in w.chunks_exact(Q5_K).enumerate() {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (qh, qs) = (&block[16..48], &block[48..176]);
        let q8 = &a.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &a.bsums[b * 16..(b + 1) * 16];
        let (mut s1, mut s2) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &block[4..16]);
            let (bytes, shift) = (&qs[(j / 2) * 32..(j / 2) * 32 + 32], 4 * (j % 2));
            let raw: i32 = (0..32)
                .map(|e| {
                    let q = ((bytes[e] >> shift) & 0x0F) | (((qh[e] >> j) & 1) << 4);
                    q as i32 * q8[j * 32 + e] as i32
                })
                .sum();
            s1 = s1.wrapping_add(sc.wrapping_mul(raw));
            s2 = s2.wrapping_add(m * (bsums[2 * j] + bsums[2 * j + 1]));
        }
        let result = (-dmin).mul_add(s2 as f32, s1 as f32 * d);
        acc = result.mul_add(a.d[b], acc);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// Dequantizes a Q4_K block the reference way.
    fn dequant_q4k(block: &[u8]) -> Vec<f32> {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let mut out = vec![0f32; QK_K];
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &block[4..16]);
            for l in 0..32 {
                let byte = block[16 + (j / 2) * 32 + l];
                let q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                out[j * 32 + l] = d * sc as f32 * q as f32 - dmin * m as f32;
            }
        }
        out
    }

    fn sample_q4k() -> Vec<u8> {
        let mut block = vec![0u8; Q4_K];
        block[0..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(0.02).to_le_bytes());
        for (i, b) in block[4..].iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        block
    }

    #[test]
    fn q4k_dot_matches_the_dequantized_product() {
        let block = sample_q4k();
        let x: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 5.0)
            .collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let w = dequant_q4k(&block);
        let exact: f32 = (0..QK_K).map(|i| w[i] * a.d[0] * a.qs[i] as f32).sum();
        for kernel in [RowKernel::Gemv, RowKernel::Gemm4] {
            let got = dot_q4k_tile(&block, &[&a], &[kernel])[0];
            assert!(
                (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
                "{kernel:?}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn q6k_dot_matches_the_dequantized_product() {
        let mut block = vec![0u8; Q6_K];
        for (i, b) in block[..208].iter_mut().enumerate() {
            *b = (i * 53 % 256) as u8;
        }
        block[208..210].copy_from_slice(&f16::from_f32(0.003).to_le_bytes());
        let x: Vec<f32> = (0..QK_K)
            .map(|i| ((i * 5 % 19) as f32 - 9.0) / 3.0)
            .collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let d = f16_at(&block, 208);
        let mut exact = 0f32;
        for j in 0..2 {
            for l in 0..32 {
                let (ql, qh) = (&block[64 * j..], block[128 + 32 * j + l]);
                let vals = [
                    (ql[l] & 0xF) | ((qh & 3) << 4),
                    (ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4),
                ];
                for (v, &u) in vals.iter().enumerate() {
                    let e = 128 * j + 32 * v + l;
                    let sc = block[192 + e / 16] as i8 as f32;
                    exact += d * sc * (u as f32 - 32.0) * a.d[0] * a.qs[e] as f32;
                }
            }
        }
        let got = dot_q6k_tile(&block, &[&a], false)[0];
        assert!(
            (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
            "{got} vs {exact}"
        );
    }

    /// The weights as candle decodes them (an independent reading of the format).
    fn candle_dequantized(block: &[u8], dtype: candle_core::quantized::GgmlDType) -> Vec<f32> {
        use candle_core::quantized::{QStorage, QTensor};
        use candle_core::Device;
        let storage =
            QStorage::from_data(std::borrow::Cow::Borrowed(block), &Device::Cpu, dtype).unwrap();
        QTensor::new(storage, (1, QK_K))
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    }

    #[test]
    fn q3k_and_q5k_dots_match_candles_dequantized_product() {
        use candle_core::quantized::GgmlDType;
        let mut rng = crate::quant::sample::Xorshift::new(5);
        let x: Vec<f32> = (0..QK_K).map(|_| rng.next_f32() * 2.0).collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        for (dtype, size, scale_at) in [(GgmlDType::Q3K, Q3_K, 108), (GgmlDType::Q5K, Q5_K, 0)] {
            let mut block: Vec<u8> = (0..size).map(|_| rng.next_u64() as u8).collect();
            block[scale_at..scale_at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            if dtype == GgmlDType::Q5K {
                block[2..4].copy_from_slice(&f16::from_f32(0.02).to_le_bytes());
            }
            let w = candle_dequantized(&block, dtype);
            let exact: f32 = (0..QK_K).map(|i| w[i] * a.d[0] * a.qs[i] as f32).sum();
            let (got, tiled) = match dtype {
                GgmlDType::Q3K => (dot_q3k_portable(&block, &a), dot_q3k_tiled(&block, &a)),
                _ => (dot_q5k_portable(&block, &a), dot_q5k_tiled(&block, &a)),
            };
            for got in [got, tiled] {
                assert!(
                    (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
                    "{dtype:?}: {got} vs {exact}"
                );
            }
        }
    }

    /// The tiled Q6_K product is the dequantized product (candle's dequantization), up to
    /// rounding.
    #[test]
    fn q6k_tiled_dot_matches_candles_dequantized_product() {
        use candle_core::quantized::GgmlDType;
        let mut rng = crate::quant::sample::Xorshift::new(7);
        let x: Vec<f32> = (0..QK_K).map(|_| rng.next_f32() * 2.0).collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let mut block: Vec<u8> = (0..Q6_K).map(|_| rng.next_u64() as u8).collect();
        block[208..210].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        let w = candle_dequantized(&block, GgmlDType::Q6K);
        let exact: f32 = (0..QK_K).map(|i| w[i] * a.d[0] * a.qs[i] as f32).sum();
        let got = dot_q6k_tiled(&block, &a);
        assert!(
            (got - exact).abs() < 1e-3 * exact.abs().max(1.0),
            "{got} vs {exact}"
        );
    }

    #[test]
    fn q8k_uses_the_signed_maximum() {
        let mut x = vec![0.5f32; QK_K];
        x[3] = -2.0;
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        // The scale comes from -2.0: iscale = -127 / -2.0 = 63.5.
        assert_eq!(a.qs[3], -127);
        assert_eq!(a.qs[0], 32);
        assert_eq!(a.bsums[0], 32 * 15 - 127);
        assert_eq!(a.d[0], 1.0 / 63.5);
    }

    #[test]
    fn simd_q8k_quantization_matches_the_portable_one() {
        let mut rng = crate::quant::sample::Xorshift::new(13);
        let mut x: Vec<f32> = (0..QK_K * 6).map(|_| rng.next_f32() * 3.0).collect();
        x[QK_K..2 * QK_K].fill(0.0); // an all-zero super-block
        x[2 * QK_K + 5] = -9.0; // ties of magnitude: negative first, then positive
        x[2 * QK_K + 200] = 9.0;
        x[3 * QK_K + 7] = 9.0; // positive first, then negative
        x[3 * QK_K + 8] = -9.0;
        x[4 * QK_K + 255] = -7.0; // the extreme last, alone
        for kernel in [RowKernel::Gemv, RowKernel::Gemm4] {
            let (fast, portable) = (
                quantize_row_q8k(&x, kernel),
                quantize_row_q8k_portable(&x, kernel),
            );
            assert_eq!(fast.qs, portable.qs, "{kernel:?}");
            assert_eq!(fast.bsums, portable.bsums, "{kernel:?}");
            let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast.d), bits(&portable.d), "{kernel:?}");
        }
    }

    /// Against llama.cpp's own two quantizers, called on rows that hit every tie rule
    /// (`fixtures/make_q8k.py`): the one-row one for GEMV, the four-row one for the
    /// repacked GEMM. Both of ours, SIMD and portable.
    #[test]
    fn q8k_quantization_matches_llama_cpps_quantizers() {
        let data: serde_json::Value =
            serde_json::from_str(include_str!("../../../../fixtures/q8k.llamacpp.json")).unwrap();
        for (kernel, name) in [
            (RowKernel::Gemv, "quantize_row_q8_K"),
            (RowKernel::Gemm4, "ggml_quantize_mat_q8_K_4x8"),
        ] {
            for (r, row) in data["rows"].as_array().unwrap().iter().enumerate() {
                let x: Vec<f32> = row
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                let want = data[name][r].as_array().unwrap();
                for got in [
                    quantize_row_q8k(&x, kernel),
                    quantize_row_q8k_portable(&x, kernel),
                ] {
                    for (b, block) in want.iter().enumerate() {
                        let d = block["d"].as_f64().unwrap() as f32;
                        assert_eq!(got.d[b].to_bits(), d.to_bits(), "{name} row {r} block {b}");
                        let qs: Vec<i8> = block["qs"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|q| q.as_i64().unwrap() as i8)
                            .collect();
                        assert_eq!(
                            &got.qs[b * QK_K..(b + 1) * QK_K],
                            &qs[..],
                            "{name} row {r} block {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn q8k_ties_follow_the_kernel() {
        let mut x = vec![0.5f32; QK_K];
        x[3] = -2.0;
        x[9] = 2.0;
        // The GEMV quantizer takes the first extreme (-2.0), the GEMM one the positive.
        assert_eq!(quantize_row_q8k(&x, RowKernel::Gemv).d[0], 1.0 / 63.5);
        let gemm = quantize_row_q8k(&x, RowKernel::Gemm4);
        assert_eq!(gemm.d[0], 1.0 / -63.5);
        assert_eq!((gemm.qs[3], gemm.qs[9]), (127, -127));
    }

    #[test]
    fn q4k_kernels_differ_only_in_rounding() {
        let blocks: Vec<u8> = (0..4).flat_map(|_| sample_q4k()).collect();
        let x: Vec<f32> = (0..4 * QK_K)
            .map(|i| ((i * 7919 % 1013) as f32 / 300.0 - 1.7) * 1.37)
            .collect();
        let a = quantize_row_q8k(&x, RowKernel::Gemv);
        let (gemv, gemm) = (
            dot_q4k_portable(&blocks, &a, RowKernel::Gemv),
            dot_q4k_portable(&blocks, &a, RowKernel::Gemm4),
        );
        assert!(
            (gemv - gemm).abs() <= 1e-5 * gemv.abs().max(1.0),
            "{gemv} vs {gemm}"
        );
    }
}
