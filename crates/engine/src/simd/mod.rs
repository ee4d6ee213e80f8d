//! The floor of shared vector math, beneath every kernel: the CPU's features decided once
//! ([`cpu`]) and asked through the tier functions here, horizontal reductions in the
//! orders llama.cpp's kernels add in ([`reduce`]), number conversions ([`convert`]),
//! `expf` as ggml (its AVX-512 and AVX2 versions) and glibc compute it ([`ggml_expf`],
//! [`exp_in_place`]), the vector lanes attention is written in, the online softmax's
//! steps every attention kernel takes ([`softmax`]), integer lanes and prefetches.
//! Nothing here knows of models, attention or weight formats; everything above may use it.

pub mod convert;
pub mod cpu;
mod expf_avx2;
pub mod ggml_expf;
pub mod int_lanes;
pub(crate) mod lanes;
mod libm_expf;
pub mod prefetch;
pub mod reduce;
pub mod softmax;

/// f32 lanes of a 512-bit vector: the rows of one lane group of the weight layouts.
pub const LANES_512: usize = 16;

/// Whether the 256-bit kernels run (AVX2 with FMA and F16C, within `FERRITE_CPU`).
#[inline]
pub fn avx2() -> bool {
    cpu::features().avx2
}

/// Whether the 512-bit kernels run (AVX-512F besides, within `FERRITE_CPU`).
#[inline]
pub fn avx512() -> bool {
    cpu::features().avx512
}

/// Whether the wide-tile integer kernels run (AVX-512 VL, BW and VNNI besides).
#[inline]
pub fn vnni() -> bool {
    cpu::features().vnni
}

/// Whether BF16 weights' kernels run (AVX-512 BW and BF16 besides AVX-512F).
#[inline]
pub fn bf16() -> bool {
    cpu::features().bf16
}

/// `f32::exp` of every value, in place: eight lanes at a time with glibc's algorithm
/// (`simd::libm_expf`; bit for bit `f32::exp` where that is glibc's `expf`, as on Linux
/// x86-64) where the AVX2 kernels run, else one by one.
/// The sampler's softmax and log-probabilities take it over whole vocabularies, where
/// the scalar call was most of their time (Gemma 3's 262,144 logits: 1.1 ms).
pub fn exp_in_place(values: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::avx2() {
        // SAFETY: the AVX2 kernels' feature set includes AVX2 and FMA.
        unsafe { libm_expf::exp_in_place_avx2(values) };
        return;
    }
    for v in values {
        *v = v.exp();
    }
}
