//! The floor of shared vector math, beneath every kernel: the CPU's features decided once
//! ([`cpu`]) and asked through the tier functions here, horizontal reductions in the
//! orders llama.cpp's kernels add in ([`reduce`]), and number conversions ([`convert`]).
//! Nothing here knows of models, attention or weight formats; everything above may use it.

pub mod convert;
pub mod cpu;
pub mod int_lanes;
pub mod prefetch;
pub mod reduce;

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
