//! The kernels' table: the row ([`OwnFormat`]) of every format with kernels of our own
//! that is not made by a family of the registry, each naming its layout choice for this
//! CPU and its portable product, the reference every layout of it matches bit for bit
//! (`QMatrix`'s test, in `mod.rs`); and which row a tensor of the file takes
//! ([`OwnFormat::of_tensor`], [`OwnFormat::of_raw`]).
//!
//! The layouts, and the modules that hold them with their kernels:
//! - Q8_0, Q4_1, Q5_0, Q4_0, Q5_1 and IQ4_NL (Q4_0 and IQ4_NL with llama.cpp's repacked
//!   arithmetic) interleaved sixteen rows to a vector where the CPU has AVX2 (kernels for
//!   AVX-512 VNNI, and for AVX2 eight rows at a time): `block_lanes`;
//! - block-of-32 formats (Q4_0 with rows not a multiple of eight, and the others
//!   elsewhere) repacked eight rows at a time: `packed` (portable) and its `simd` child
//!   (AVX2, AVX-512 VNNI);
//! - Q4_K and Q6_K interleaved sixteen rows to a vector where the CPU has AVX2 (kernels
//!   for AVX-512 VNNI, and for AVX2 alone eight rows at a time): `q4k_lanes`, `q6k_lanes`;
//! - Q5_K and IQ4_XS two rows to a vector with AVX-512 VNNI (`pair_lanes`); with AVX2
//!   alone they, and Q2_K and Q3_K wherever the CPU has AVX2, sixteen rows to a vector
//!   (`k_lanes`: kernels for AVX-512 VNNI, Q2_K's and Q3_K's, and for AVX2 eight rows at a
//!   time);
//! - every other quantized format, and these on other CPUs, row after row: `rows`
//!   (portable kernels in the formats' files, `formats/`);
//! - F32, F16 and BF16 row after row: `float_rows` (portable `float`, AVX-512 or AVX2
//!   `float_simd`).
//!
//! However a matrix is laid out, each row's arithmetic is that of its format's portable
//! kernel, so the choice changes speed only.

use candle_core::quantized::{GgmlDType, QTensor};

use super::block_lanes::{BlockLanes, LaneBlock};
use super::float::{self, dot_bf16, dot_f16, dot_f32};
use super::float_rows::FloatRows;
use super::formats::iq4_nl::Iq4Nl;
use super::formats::iq4_xs::Iq4Xs;
use super::formats::kquant::SuperBlock;
use super::formats::table4::Table4;
use super::formats::{block32, iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1};
use super::formats::{q5_k, q6_k, q8_0, table4, FormatInfo};
use super::iq4;
use super::k_lanes::KLanes;
use super::layout::Layout;
use super::own::{quantized, Dot, LayOut, OwnFormat};
use super::packed::{Packed, PackedRows};
use super::pair_lanes::PairLanes;
use super::q4k_lanes::Q4kLanes;
use super::q6k_lanes::Q6kLanes;
use super::q8::{quantize_row_portable, Q8Row};
use super::q8k::{quantize_row_q8k, Q8KRow, QK_K};
use super::rows::{RowDot, RowMajor};
use super::{ActivationKind, RowKernel, CHUNK};
use crate::error::EngineError;
use crate::simd::{avx2, vnni};

/// Which row a tensor takes.
impl OwnFormat {
    /// The row of a GGUF tensor if we multiply it ourselves: Q4_0 and Q2_K as llama.cpp
    /// does once it has repacked them where the rows allow it (rows a multiple of eight;
    /// Q2_K not otherwise), the floats where llama.cpp's tinyBLAS takes the shape. A
    /// tensor of one of these types must be a matrix.
    pub(super) fn of_tensor(tensor: &QTensor) -> Result<Option<&'static Self>, EngineError> {
        use GgmlDType::*;
        let dtype = tensor.dtype();
        if !matches!(
            dtype,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K
        ) && !matches!(dtype, F32 | F16 | BF16)
        {
            return Ok(None);
        }
        let (rows, cols) = tensor.shape().dims2()?;
        let eights = rows.is_multiple_of(8);
        Ok(Some(match dtype {
            GgmlDType::Q4_0 if eights => Self::Q4_0_REPACKED,
            GgmlDType::Q4_0 => Self::Q4_0,
            GgmlDType::Q4_1 => Self::Q4_1,
            GgmlDType::Q5_0 => Self::Q5_0,
            GgmlDType::Q5_1 => Self::Q5_1,
            GgmlDType::Q8_0 => Self::Q8_0,
            GgmlDType::Q2K if eights => Self::Q2_K_REPACKED,
            GgmlDType::Q3K => Self::Q3_K,
            GgmlDType::Q4K => Self::Q4_K,
            GgmlDType::Q5K => Self::Q5_K,
            GgmlDType::Q6K => Self::Q6_K,
            GgmlDType::F32 if float::tinyblas_takes(rows, cols, false) => Self::F32,
            GgmlDType::F16 if float::tinyblas_takes(rows, cols, false) => Self::F16,
            GgmlDType::BF16 if float::tinyblas_takes(rows, cols, true) => Self::BF16,
            _ => return Ok(None),
        }))
    }

    /// The row of a matrix of a format the registry reads from the file's bytes and
    /// this table multiplies ([`super::formats::MatrixReader::Table`]), `rows` of them:
    /// IQ4_NL where llama.cpp repacks it (rows a multiple of eight; it reads no other,
    /// `iq4_nl.rs`), IQ4_XS always.
    pub(super) fn of_raw(format: &FormatInfo, rows: usize) -> Option<&'static Self> {
        match format.ggml_type {
            Iq4Nl::GGML_TYPE => rows.is_multiple_of(8).then_some(Self::IQ4_NL_REPACKED),
            Iq4Xs::GGML_TYPE => Some(Self::IQ4_XS),
            _ => None,
        }
    }
}

/// A float row: twice the task size (`super::QMatrix::chunk_rows`), rounded by kernel, no
/// scales; its "blocks" are the values its kernels take at a time (`(values, bytes)`), of
/// which a row must be a whole number.
const fn floating(
    name: &'static str,
    block: (usize, usize),
    activations: ActivationKind,
    lay_out: LayOut,
    dot: Dot,
) -> OwnFormat {
    OwnFormat {
        rounds_by_kernel: true,
        chunk_rows: 2 * CHUNK,
        scales: &[],
        ..quantized(name, block, activations, lay_out, dot)
    }
}

/// A block-of-32 row's geometry.
const fn b32<F: block32::Block32>() -> (usize, usize) {
    (32, block32::block_bytes::<F>())
}

/// A block-of-32 format in the sixteen-row lanes where the CPU has AVX2, the eight-row
/// packed layout elsewhere.
fn lanes_or_packed<F: LaneBlock + Packed>(d: &[u8], r: usize, c: usize) -> Box<dyn Layout> {
    match avx2() {
        true => Box::new(BlockLanes::<F>::new(d, r, c)),
        false => Box::new(PackedRows::<F>::new(d, r, c)),
    }
}

/// The family's `vec_dot` product of a weight row with `x` quantized to Q8.
fn block_dot<F: block32::Block32>(w: &[u8], x: &[f32], _: RowKernel) -> f32 {
    block32::dot::<F>(w, &q8(x))
}

/// Row after row, with the portable kernel `dot`.
fn rows(dot: RowDot, data: &[u8], rows: usize) -> Box<dyn Layout> {
    Box::new(RowMajor::new(dot, data, rows))
}

/// The activation row `x` as Q8.
fn q8(x: &[f32]) -> Q8Row {
    quantize_row_portable(x)
}

/// The activation row `x` as Q8_K, as the GEMV quantizes it.
fn q8k(x: &[f32]) -> Q8KRow {
    quantize_row_q8k(x, RowKernel::Gemv)
}

/// The f32, f16 or bf16 values of a row's little-endian bytes.
fn floats<T>(w: &[u8], read: fn(&[u8]) -> T) -> Vec<T> {
    w.chunks_exact(size_of::<T>()).map(read).collect()
}

/// The table.
impl OwnFormat {
    /// Q4_0 in a matrix llama.cpp does not repack (rows not a multiple of eight).
    pub const Q4_0: &'static Self = &quantized(
        "Q4_0",
        b32::<q4_0::Q4_0>(),
        ActivationKind::Q8,
        |d, r, c| Box::new(PackedRows::<q4_0::Q4_0>::new(d, r, c)),
        block_dot::<q4_0::Q4_0>,
    );
    /// Q4_0 in a matrix llama.cpp repacks (rows a multiple of eight).
    pub const Q4_0_REPACKED: &'static Self = &quantized(
        "Q4_0 repacked",
        b32::<q4_0::Q4_0>(),
        ActivationKind::Q8,
        |d, r, c| match avx2() {
            true => Box::new(BlockLanes::<q4_0::Q4_0>::new(d, r, c)),
            false => rows(RowDot::Q8(block32::dot_repacked::<q4_0::Q4_0>), d, r),
        },
        |w, x, _| block32::dot_repacked::<q4_0::Q4_0>(w, &q8(x)),
    );
    /// Q4_1.
    pub const Q4_1: &'static Self = &OwnFormat {
        scales: &[(0, 1.0), (2, -8.0)],
        ..quantized(
            "Q4_1",
            b32::<q4_1::Q4_1>(),
            ActivationKind::Q8,
            lanes_or_packed::<q4_1::Q4_1>,
            block_dot::<q4_1::Q4_1>,
        )
    };
    /// Q5_0.
    pub const Q5_0: &'static Self = &quantized(
        "Q5_0",
        b32::<q5_0::Q5_0>(),
        ActivationKind::Q8,
        lanes_or_packed::<q5_0::Q5_0>,
        block_dot::<q5_0::Q5_0>,
    );
    /// Q5_1.
    pub const Q5_1: &'static Self = &OwnFormat {
        scales: &[(0, 1.0), (2, 1.0)],
        ..quantized(
            "Q5_1",
            b32::<q5_1::Q5_1>(),
            ActivationKind::Q8,
            |d, r, c| match avx2() {
                true => Box::new(BlockLanes::<q5_1::Q5_1>::new(d, r, c)),
                false => rows(RowDot::Q8(block32::dot::<q5_1::Q5_1>), d, r),
            },
            block_dot::<q5_1::Q5_1>,
        )
    };
    /// Q8_0.
    pub const Q8_0: &'static Self = &quantized(
        "Q8_0",
        b32::<q8_0::Q8_0>(),
        ActivationKind::Q8,
        lanes_or_packed::<q8_0::Q8_0>,
        block_dot::<q8_0::Q8_0>,
    );
    /// Q2_K in a matrix llama.cpp repacks (rows a multiple of eight), against Q8_K
    /// activations quantized as each row's kernel does.
    pub const Q2_K_REPACKED: &'static Self = &OwnFormat {
        scales: &[(80, 1.0), (82, 1.0)],
        ..quantized(
            "Q2_K repacked",
            (QK_K, q2_k::BYTES),
            ActivationKind::Q8KByKernel,
            |d, r, c| match avx2() {
                true => Box::new(KLanes::<q2_k::Q2K>::new(d, r, c / QK_K)),
                false => rows(
                    RowDot::Q8K(|w, a, kernels, _| {
                        std::array::from_fn(|t| match a.get(t) {
                            Some(a) => q2_k::dot_repacked(w, a, kernels[t]),
                            None => 0.0,
                        })
                    }),
                    d,
                    r,
                ),
            },
            |w, x, kernel| q2_k::dot_repacked(w, &quantize_row_q8k(x, kernel), kernel),
        )
    };
    /// Q3_K.
    pub const Q3_K: &'static Self = &OwnFormat {
        scales: &[(108, 1.0)],
        ..quantized(
            "Q3_K",
            (QK_K, q3_k::BYTES),
            ActivationKind::Q8KGemv,
            |d, r, c| match avx2() {
                true => Box::new(KLanes::<q3_k::Q3K>::new(d, r, c / QK_K)),
                false => rows(
                    RowDot::Q8K(|w, a, _, wide| q3_k::dot_tile(w, a, wide)),
                    d,
                    r,
                ),
            },
            |w, x, _| q3_k::dot(w, &q8k(x)),
        )
    };
    /// Q4_K, against Q8_K activations quantized as each row's kernel does.
    pub const Q4_K: &'static Self = &OwnFormat {
        scales: &[(0, 1.0), (2, 1.0)],
        ..quantized(
            "Q4_K",
            (QK_K, q4_k::BYTES),
            ActivationKind::Q8KByKernel,
            |d, r, c| match avx2() {
                true => Box::new(Q4kLanes::new(d, r, c / QK_K)),
                false => rows(
                    RowDot::Q8K(|w, a, kernels, _| q4_k::dot_tile(w, a, kernels)),
                    d,
                    r,
                ),
            },
            |w, x, kernel| q4_k::dot(w, &quantize_row_q8k(x, kernel), kernel),
        )
    };
    /// Q5_K.
    pub const Q5_K: &'static Self = &OwnFormat {
        scales: &[(0, 1.0), (2, 1.0)],
        ..quantized(
            "Q5_K",
            (QK_K, q5_k::BYTES),
            ActivationKind::Q8KGemv,
            |d, r, c| match (vnni(), avx2()) {
                (true, _) => Box::new(PairLanes::<q5_k::Q5K>::new(d, r, c / QK_K)),
                (false, true) => Box::new(KLanes::<q5_k::Q5K>::new(d, r, c / QK_K)),
                _ => rows(
                    RowDot::Q8K(|w, a, _, wide| q5_k::dot_tile(w, a, wide)),
                    d,
                    r,
                ),
            },
            |w, x, _| q5_k::dot(w, &q8k(x)),
        )
    };
    /// Q6_K.
    pub const Q6_K: &'static Self = &OwnFormat {
        scales: &[(208, 1.0)],
        ..quantized(
            "Q6_K",
            (QK_K, q6_k::BYTES),
            ActivationKind::Q8KGemv,
            |d, r, c| match avx2() {
                true => Box::new(Q6kLanes::new(d, r, c / QK_K)),
                false => rows(
                    RowDot::Q8K(|w, a, _, wide| q6_k::dot_tile(w, a, wide)),
                    d,
                    r,
                ),
            },
            |w, x, _| q6_k::dot(w, &q8k(x)),
        )
    };
    /// IQ4_NL in a matrix llama.cpp repacks (rows a multiple of eight; it reads no other,
    /// `iq4_nl.rs`).
    pub const IQ4_NL_REPACKED: &'static Self = &quantized(
        "IQ4_NL repacked",
        (32, iq4::IQ4_NL),
        ActivationKind::Q8,
        |d, r, c| match avx2() {
            true => Box::new(BlockLanes::<iq4_nl::Iq4Nl>::new(d, r, c)),
            false => rows(RowDot::Q8(table4::dot::<iq4_nl::Iq4Nl>), d, r),
        },
        |w, x, _| table4::dot::<iq4_nl::Iq4Nl>(w, &q8(x)),
    );
    /// IQ4_XS.
    pub const IQ4_XS: &'static Self = &quantized(
        "IQ4_XS",
        (QK_K, iq4_xs::BYTES),
        ActivationKind::Q8KGemv,
        |d, r, c| match (vnni(), avx2()) {
            (true, _) => Box::new(PairLanes::<iq4_xs::Iq4Xs>::new(d, r, c / QK_K)),
            (false, true) => Box::new(KLanes::<iq4_xs::Iq4Xs>::new(d, r, c / QK_K)),
            _ => rows(
                RowDot::Q8K(|w, a, _, wide| iq4_xs::dot_tile(w, a, wide)),
                d,
                r,
            ),
        },
        |w, x, _| iq4_xs::dot(w, &q8k(x)),
    );
    /// F32 against f32 activations (llama.cpp's tinyBLAS and vector dot product).
    pub const F32: &'static Self = &floating(
        "F32",
        (16, 64),
        ActivationKind::F32,
        |d, _, c| Box::new(FloatRows::<f32>::new(d, c)),
        |w, x, kernel| {
            let w = floats(w, |b| f32::from_le_bytes(b.try_into().expect("4 bytes")));
            dot_f32(&w, x, kernel.batched())
        },
    );
    /// F16 against activations rounded to F16 (likewise).
    pub const F16: &'static Self = &floating(
        "F16",
        (16, 32),
        ActivationKind::F16,
        |d, _, c| Box::new(FloatRows::<half::f16>::new(d, c)),
        |w, x, kernel| {
            let w = floats(w, |b| {
                half::f16::from_le_bytes(b.try_into().expect("2 bytes"))
            });
            dot_f16(&w, &crate::simd::convert::round_to_f16(x), kernel.batched())
        },
    );
    /// BF16 against activations rounded to BF16 (llama.cpp's AVX512-BF16 kernels).
    pub const BF16: &'static Self = &floating(
        "BF16",
        (32, 64),
        ActivationKind::Bf16,
        |d, _, c| Box::new(FloatRows::<half::bf16>::new(d, c)),
        |w, x, kernel| {
            let w = floats(w, |b| {
                half::bf16::from_le_bytes(b.try_into().expect("2 bytes"))
            });
            dot_bf16(
                &w,
                &crate::simd::convert::round_to_bf16(x),
                kernel.batched(),
            )
        },
    );

    /// Every row of the table (not the families' rows).
    pub const ALL: [&'static Self; 16] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q8_0,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0_REPACKED,
        Self::Q5_1,
        Self::Q3_K,
        Self::Q2_K_REPACKED,
        Self::IQ4_XS,
        Self::IQ4_NL_REPACKED,
    ];
}
