//! Quantized weight matrices and their products with f32 activations.
//!
//! For the formats whose kernels we own (every block-of-32 and K-quant format, IQ4_NL,
//! IQ4_XS, and the float types in `float.rs`) the arithmetic follows ggml's x86 kernels
//! step for step: activations are quantized the same way (scale `127/amax`, round half to
//! even), each block's integer dot product is split into the same lanes, lanes are
//! accumulated with fused multiply-adds and summed in the same order. The small models
//! served here are chaotic enough that this is what keeps greedy output identical to
//! llama.cpp's; it also makes every row's result independent of the other rows in the
//! batch. Where llama.cpp rounds a row differently when it is part of a four-row group of
//! prompt tokens (its repacked Q4_K and Q2_K GEMMs, tinyBLAS for the float types), the
//! caller says per row which of its kernels to follow ([`RowKernel`]); the result still
//! depends only on the row and that choice. Other formats use candle's kernels.
//!
//! Q4_0, Q2_K and IQ4_NL in a matrix whose rows are a multiple of eight follow llama.cpp's
//! repacked kernels, which is what it runs on x86 CPUs with AVX2 (AVX-512 for Q2_K).
//!
//! How each matrix holds its weights is chosen once at load, by its format's row of the
//! kernels' table (`table.rs`): every layout
//! (repacked block-of-32 rows, the sixteen-row block-of-32 and Q4_K/Q6_K vectors of AVX2
//! and AVX-512 VNNI, the Q5_K/IQ4_XS vectors of two rows (AVX-512 VNNI) and the
//! Q2_K/Q3_K/Q5_K/IQ4_XS ones of sixteen (AVX2; Q2_K's and Q3_K's AVX-512 VNNI too), plain
//! rows, float rows) sits behind one
//! `Layout` trait, in the module of its kernels. Products run in tiles: a few weight rows
//! by several activation rows, each weight block decoded once per tile and each activation
//! block loaded once per tile, over activation tiles that stay in the first-level cache;
//! with AVX-512 VNNI the integer lanes take one instruction and a prompt's Q8 rows are laid
//! out once as activation tiles (`act_tile.rs`), the vectors the block-of-32 kernel takes
//! as operands.
//! None of this changes a pair's arithmetic.

mod act_tile;
mod bf16_simd;
mod float;
mod float_rows;
mod float_simd;
pub mod formats;
pub mod kv;
#[macro_use]
mod q8k;
mod block_lanes;
mod iq4;
mod k_lanes;
mod layout;
mod output;
mod own;
mod packed;
mod pair_lanes;
mod panels;
mod q4k_lanes;
mod q6k_lanes;
mod q8;
mod rows;
pub mod sample;
mod table;

use candle_core::quantized::{QMatMul, QTensor};
use rayon::prelude::*;

use crate::error::EngineError;
use act_tile::{ActTile, TILE_ROWS};
use candle_core::{Device, Module, Tensor};
use layout::Layout;
use output::{Columns, Output};

/// How [`QMatrix::products`] hands its results back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Results {
    /// One `n × rows` matrix per product.
    Matrices,
    /// One vector per activation row (of a single product).
    Rows,
}

pub use own::OwnFormat;
pub use panels::PanelMatrix;

/// Which of llama.cpp's kernels a row's arithmetic follows. They compute the same sums and
/// differ only in rounding: llama.cpp multiplies a prompt's rows four at a time (GEMM) and
/// the rest, including every decoded token, one at a time (GEMV); and from a micro-batch of
/// 8 rows it multiplies the K-quant and IQ4_XS weights it does not repack (Q3_K, Q5_K, Q6_K,
/// IQ4_XS) with its tiled kernel, whose sums differ from both; ferrite follows it for those
/// four (`pair_lanes::tiled`, `q6k_lanes::tiled`, `rows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowKernel {
    /// The row alone (matrix × vector): a generated token, a lone prompt row, a row whose
    /// logits are computed alone.
    #[default]
    Gemv,
    /// A row of a micro-batch of two to seven rows that is not in one of its groups of
    /// four: the K-quant kernels take it as a GEMV row, the float formats' batched
    /// product (llama.cpp's tinyBLAS) with the rest of the batch.
    GemvInBatch,
    /// The row as one of a group of four (matrix × four rows) of a micro-batch of four to
    /// seven rows.
    Gemm4,
    /// As [`RowKernel::GemvInBatch`], in a micro-batch of 8 rows or more.
    GemvInWideBatch,
    /// As [`RowKernel::Gemm4`], in a micro-batch of 8 rows or more.
    Gemm4InWideBatch,
}

impl RowKernel {
    /// Micro-batches of this many rows or more are wide: llama.cpp takes its tiled kernel
    /// for them (`ggml_tiled_min_batch`).
    pub const WIDE_BATCH: usize = 8;

    /// Whether the row is multiplied as part of a batch of two or more rows.
    pub fn batched(self) -> bool {
        self != Self::Gemv
    }

    /// Whether the row is one of a group of four.
    pub fn in_group_of_four(self) -> bool {
        matches!(self, Self::Gemm4 | Self::Gemm4InWideBatch)
    }

    /// Whether the row is in a micro-batch of [`Self::WIDE_BATCH`] rows or more.
    pub fn in_wide_batch(self) -> bool {
        matches!(self, Self::GemvInWideBatch | Self::Gemm4InWideBatch)
    }
}

/// The kinds of quantized activations the formats' dot products take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActivationKind {
    /// Q8 blocks of 32 (every block-of-32 format).
    Q8,
    /// Q8_K super-blocks, each row quantized as its kernel says (Q4_K).
    Q8KByKernel,
    /// Q8_K super-blocks quantized as the GEMV does (Q6_K, whichever the kernel).
    Q8KGemv,
    /// The f32 rows as they are.
    F32,
    /// The rows rounded to F16.
    F16,
    /// The rows rounded to BF16.
    Bf16,
}

/// Quantized activation rows, in the form a format's dot products take.
enum Activations {
    /// Q8 rows, for a prompt under AVX-512 VNNI the same rows as tiles (where an
    /// eight-row block-of-32 matrix reads them; empty otherwise), and the lane
    /// starts the sixteen-row block-of-32 kernels add (computed by the first chunk that
    /// needs them).
    Q8(Vec<q8::Q8Row>, Vec<ActTile>, block_lanes::StartsOnce),
    /// Q8_K rows, and the sums the Q5_K / IQ4_XS / Q6_K kernels add, each computed by the
    /// first chunk that needs them.
    Q8K(Vec<q8k::Q8KRow>, pair_lanes::SumsOnce),
    /// Float rows, row-major, for F32 weights.
    Float(Vec<f32>),
    /// Rows rounded to BF16 (held as f32), row-major, for BF16 weights; and the same as
    /// BF16 if any row is batched and the AVX512-BF16 tiles run (empty otherwise).
    Brain(Vec<f32>, Vec<half::bf16>),
    /// Rows rounded to F16, row-major, for F16 weights.
    Half(Vec<half::f16>),
}

impl Activations {
    /// The rows of `x` (`cols` wide), quantized as `kind` says (in parallel for a prompt;
    /// a few decode rows take less time than waking the other threads); Q8 rows also as
    /// tiles where `tiles` says a matrix will read them ([`Layout::reads_act_tiles`]).
    fn quantize(
        kind: ActivationKind,
        x: &[f32],
        cols: usize,
        kernels: &[RowKernel],
        tiles: bool,
    ) -> Self {
        let rows = x.par_chunks_exact(cols).zip(kernels).with_min_len(16);
        match kind {
            ActivationKind::Q8 => {
                let rows: Vec<q8::Q8Row> = rows.map(|(r, _)| q8::quantize_row(r)).collect();
                let tiles = if tiles && kernels.len() >= 4 && crate::simd::vnni() {
                    let refs: Vec<&q8::Q8Row> = rows.iter().collect();
                    refs.par_chunks(TILE_ROWS)
                        .map(|tile| ActTile::new(tile, cols / 32))
                        .collect()
                } else {
                    Vec::new()
                };
                Self::Q8(rows, tiles, Default::default())
            }
            // Only the repacked Q4_K GEMM quantizes its rows differently.
            ActivationKind::Q8KByKernel => Self::Q8K(
                rows.map(|(r, &kernel)| q8k::quantize_row_q8k(r, kernel))
                    .collect(),
                Default::default(),
            ),
            ActivationKind::F32 => Self::Float(x.to_vec()),
            ActivationKind::F16 => Self::Half(crate::simd::convert::round_to_f16(x)),
            ActivationKind::Bf16 => {
                let rounded = crate::simd::convert::round_to_bf16(x);
                // Only the AVX512-BF16 tiles read them narrowed.
                let narrowed = match kernels.iter().any(|k| k.batched()) && crate::simd::bf16() {
                    true => crate::simd::convert::narrow_to_bf16(&rounded),
                    false => Vec::new(),
                };
                Self::Brain(rounded, narrowed)
            }
            ActivationKind::Q8KGemv => Self::Q8K(
                rows.map(|(r, _)| q8k::quantize_row_q8k(r, RowKernel::Gemv))
                    .collect(),
                Default::default(),
            ),
        }
    }
}

/// A weight matrix of `rows` output features by `cols` inputs.
pub enum QMatrix {
    /// A format with our own kernels.
    Own {
        /// The format of the rows.
        format: &'static OwnFormat,
        /// The weights, laid out for this CPU's kernels.
        data: LaidOut,
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
    },
    /// Any other format, through candle.
    Candle(QMatMul),
}

impl QMatrix {
    /// Wraps a GGUF tensor (`[rows, cols]`).
    pub fn new(tensor: QTensor) -> Result<Self, EngineError> {
        let format = OwnFormat::of_tensor(&tensor)?;
        match format {
            Some(format) => {
                let (rows, cols) = tensor.shape().dims2()?;
                Self::from_slice(format, &tensor.data()?, rows, cols)
            }
            None => Ok(Self::Candle(QMatMul::from_qtensor(tensor)?)),
        }
    }

    /// A matrix of a type candle does not read, from the file's bytes: by the registry's
    /// reader for it ([`formats::MatrixReader::Raw`]), or as the kernels' table says
    /// ([`formats::MatrixReader::Table`]); `None` for a type ferrite does not read this way
    /// or a shape it has no kernel for.
    pub fn from_raw(
        ggml_type: u32,
        data: &[u8],
        rows: usize,
        cols: usize,
    ) -> Option<Result<Self, EngineError>> {
        let format = formats::find(ggml_type)?;
        match format.matrix {
            formats::MatrixReader::Raw(read) => read(data, rows, cols),
            formats::MatrixReader::Table => {
                let own = OwnFormat::of_raw(format, rows)?;
                Some(Self::from_slice(own, data, rows, cols))
            }
            formats::MatrixReader::Candle(_) => None,
        }
    }

    /// A `rows × cols` matrix of `format` from its raw blocks, row after row.
    pub fn from_blocks(
        format: &'static OwnFormat,
        data: Vec<u8>,
        rows: usize,
        cols: usize,
    ) -> Result<Self, EngineError> {
        Self::from_slice(format, &data, rows, cols)
    }

    /// [`Self::from_blocks`] from borrowed blocks: a block-of-32 format is repacked
    /// straight from them, so loading never holds a second full copy of the matrix.
    pub(super) fn from_slice(
        format: &'static OwnFormat,
        data: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, EngineError> {
        if !cols.is_multiple_of(format.block_len()) {
            return Err(EngineError::InvalidModel(format!(
                "row width {cols} is not a multiple of {}",
                format.block_len()
            )));
        }
        if data.len() != rows * format.row_bytes(cols) {
            return Err(EngineError::InvalidModel(
                "quantized tensor has the wrong size".into(),
            ));
        }
        let data = LaidOut(format.laid_out(data, rows, cols));
        Ok(Self::Own {
            format,
            data,
            rows,
            cols,
        })
    }

    /// Output features (the rows of the stored matrix).
    pub fn rows(&self) -> usize {
        match self {
            Self::Own { rows, .. } => *rows,
            Self::Candle(QMatMul::QTensor(t)) => t.shape().dims()[0],
            Self::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.dims()[0],
        }
    }

    /// Input features (the columns of the stored matrix).
    pub fn cols(&self) -> usize {
        match self {
            Self::Own { cols, .. } => *cols,
            Self::Candle(QMatMul::QTensor(t)) => t.shape().dims()[1],
            Self::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => t.dims()[1],
        }
    }

    /// Whether a row's result depends on its [`RowKernel`] (only the Q4_K kernels round
    /// differently as GEMV and GEMM).
    pub fn rounds_by_kernel(&self) -> bool {
        matches!(self, Self::Own { format, .. } if format.rounds_by_kernel)
    }

    /// `x · Wᵀ` for the activation rows of `x` (row-major), one per entry of `kernels`,
    /// each rounded as its kernel says: an `n × rows` result. Every row is computed on its
    /// own, so its result never depends on the rest of the batch.
    pub fn matmul(&self, x: &[f32], kernels: &[RowKernel]) -> Result<Vec<f32>, EngineError> {
        let mut out = Self::matmul_many(&[self], x, kernels)?;
        Ok(out.pop().expect("one product per matrix"))
    }

    /// [`Self::matmul`] with each activation row's result a vector of its own (the logits
    /// rows a step hands the sampler), written in place by the parallel tasks (copied out
    /// of candle's result for a matrix it multiplies).
    pub fn matmul_rows(
        &self,
        x: &[f32],
        kernels: &[RowKernel],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        match self {
            Self::Candle(c) => match self.rows() {
                0 => Ok(vec![Vec::new(); kernels.len()]),
                rows => {
                    let out = candle_linear(c, x, kernels.len())?;
                    Ok(out.chunks_exact(rows).map(<[f32]>::to_vec).collect())
                }
            },
            Self::Own { .. } => Self::products(&[self], x, kernels, Results::Rows),
        }
    }

    /// [`Self::matmul`] of several matrices with the same input (a layer's query, key and
    /// value projections, say): the input is quantized once per kind of activations the
    /// matrices take, and all products share one parallel pass, so that the threads
    /// synchronise once rather than once per matrix. The results are those of
    /// [`Self::matmul`], in the order of `matrices`.
    pub fn matmul_many(
        matrices: &[&QMatrix],
        x: &[f32],
        kernels: &[RowKernel],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        Self::products(matrices, x, kernels, Results::Matrices)
    }

    /// The products of [`Self::matmul_many`], or of [`Self::matmul_rows`]'s one matrix, in
    /// one parallel pass; the results as `results` says.
    fn products(
        matrices: &[&QMatrix],
        x: &[f32],
        kernels: &[RowKernel],
        results: Results,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = kernels.len();
        // Quantized inputs, shared by the matrices that take the same kind.
        let mut acts: Vec<(ActivationKind, Activations)> = Vec::new();
        let mut inputs = Vec::with_capacity(matrices.len());
        for m in matrices {
            let Self::Own { format, cols, .. } = m else {
                inputs.push(None);
                continue;
            };
            let kind = format.activations;
            let i = match acts.iter().position(|(k, _)| *k == kind) {
                Some(i) => i,
                None => {
                    // Tiles only where a matrix taking this kind reads them.
                    let tiles = matrices.iter().any(|m| match m {
                        Self::Own { format, data, .. } => {
                            format.activations == kind && data.0.reads_act_tiles()
                        }
                        Self::Candle(_) => false,
                    });
                    acts.push((kind, Activations::quantize(kind, x, *cols, kernels, tiles)));
                    acts.len() - 1
                }
            };
            inputs.push(Some(i));
        }
        // One task per chunk of output features of every matrix.
        let tasks: Vec<(usize, usize)> = matrices
            .iter()
            .enumerate()
            .flat_map(|(mi, m)| match m {
                Self::Own { rows, .. } => (0..rows.div_ceil(m.chunk_rows()))
                    .map(|c| (mi, c))
                    .collect(),
                Self::Candle(_) => Vec::new(),
            })
            .collect();
        // Each task zeroes and then writes its chunk's columns of its matrix's output in
        // place: the outputs are allocated, not zeroed, by this thread while the others
        // wait (16 MB a step for 16 rows of Gemma 3's logits).
        let mut outs: Vec<Vec<f32>> = Vec::with_capacity(match results {
            Results::Matrices => matrices.len(),
            Results::Rows => n,
        });
        let targets: Vec<Output> = match results {
            Results::Matrices => {
                for m in matrices {
                    outs.push(match m {
                        Self::Candle(c) => candle_linear(c, x, n)?,
                        Self::Own { rows, .. } => Vec::with_capacity(n * rows),
                    });
                }
                outs.iter_mut()
                    .zip(matrices)
                    .map(|(out, m)| match m {
                        // Lent with no columns: no task writes it.
                        Self::Candle(_) => Output::new(&mut [], 0, 0),
                        Self::Own { rows, .. } => Output::spare(out, n, *rows),
                    })
                    .collect()
            }
            Results::Rows => {
                assert!(matrices.len() == 1 && matches!(matrices[0], Self::Own { .. }));
                let rows = matrices[0].rows();
                outs.extend((0..n).map(|_| Vec::with_capacity(rows)));
                vec![Output::spare_rows(&mut outs, rows)]
            }
        };
        crate::threads::for_each_index(tasks.len(), |i| {
            let (mi, c) = tasks[i];
            let acts = &acts[inputs[mi].expect("own matrices have inputs")].1;
            let Self::Own { rows, .. } = matrices[mi] else {
                unreachable!("only own matrices have tasks");
            };
            let per = matrices[mi].chunk_rows();
            let columns = c * per..((c + 1) * per).min(*rows);
            // SAFETY: tasks are distinct (matrix, chunk) pairs, so their columns never
            // overlap.
            let out = unsafe { targets[mi].columns(columns) };
            out.zero();
            matrices[mi].chunk(acts, kernels, c, &out);
        });
        drop(targets);
        // SAFETY (each): every column of every own matrix's output was zeroed, then
        // written, by the task of its chunk (the chunks cover its rows), and every task
        // has run: `for_each_index` runs every index once, or passes a panic on after the
        // other tasks have run, which ends this function before this point.
        match results {
            Results::Matrices => {
                for (out, m) in outs.iter_mut().zip(matrices) {
                    if let Self::Own { rows, .. } = m {
                        // SAFETY: every element was written and every task has run (see above).
                        unsafe { output::fill(out, n * rows) };
                    }
                }
            }
            Results::Rows => {
                let rows = matrices[0].rows();
                for out in &mut outs {
                    // SAFETY: every element was written and every task has run (see above).
                    unsafe { output::fill(out, rows) };
                }
            }
        }
        Ok(outs)
    }

    /// Output features `c·CHUNK..` (up to [`CHUNK`] of them) for every activation row,
    /// written into `out`.
    fn chunk(&self, acts: &Activations, kernels: &[RowKernel], c: usize, out: &Columns) {
        let Self::Own { data, rows, .. } = self else {
            unreachable!("only own formats are chunked");
        };
        let n = self.chunk_rows();
        let start = c * n;
        data.0
            .chunk(acts, kernels, start..(start + n).min(*rows), out);
    }

    /// Output features per parallel task: [`CHUNK`], and twice that for the float formats.
    /// A 1B F16 decode is a stream of 2.15 GB per token at the memory's speed, split into
    /// some 65 parallel products; with 256-row tasks (1–4 MiB of weights each) it ran
    /// 1.4% faster than with 128 in a paired A/B (16 pairs, 11 won), and 32-row tasks
    /// were 2.5% slower; prefill was unchanged (BENCHMARKS-history.md, issue 17's F16 cell). No
    /// layout of a float matrix depends on the task size.
    fn chunk_rows(&self) -> usize {
        match self {
            Self::Own { format, .. } => format.chunk_rows,
            Self::Candle(_) => CHUNK,
        }
    }
}

/// A matrix's weights in the layout its format's row chose for them (`OwnFormat::laid_out`;
/// opaque outside this module).
pub struct LaidOut(Box<dyn Layout>);

/// A token embedding: rows looked up by token id, as f32.
pub enum Embedding {
    /// A type candle reads (it dequantizes the rows).
    Candle(QTensor),
    /// Rows of a format candle does not read, dequantized by the registry's code for it.
    Rows {
        /// The rows' format (one whose rows it dequantizes, [`formats::FormatInfo::reads_rows`]).
        format: &'static formats::FormatInfo,
        /// The rows' bytes.
        data: Vec<u8>,
        /// Values per row.
        width: usize,
    },
}

impl Embedding {
    /// The rows of `ids`, one after another.
    pub fn rows(&self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        match self {
            Self::Candle(t) => {
                let ids = candle_core::Tensor::new(ids, &candle_core::Device::Cpu)?;
                Ok(t.embedding(&ids)?.flatten_all()?.to_vec1::<f32>()?)
            }
            Self::Rows {
                format,
                data,
                width,
            } => {
                let dequantize = format.dequantize.ok_or_else(|| {
                    EngineError::InvalidModel(format!("{format:?} embeddings are not read"))
                })?;
                let row_bytes = format.row_bytes(*width);
                let mut out = Vec::with_capacity(ids.len() * width);
                for &id in ids {
                    let row = data
                        .get(id as usize * row_bytes..(id as usize + 1) * row_bytes)
                        .ok_or_else(|| {
                            EngineError::InvalidModel(format!("token {id} has no embedding row"))
                        })?;
                    dequantize(row, &mut out);
                }
                Ok(out)
            }
        }
    }
}

/// Multiplies each of the `rows` rows of `x` (row-major, `x.len() / rows` wide) by `w`ᵀ
/// with candle: the formats this engine has no kernel of its own for.
fn candle_linear(w: &QMatMul, x: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
    let cols = x.len() / rows;
    let t = Tensor::from_slice(x, (rows, cols), &Device::Cpu)?;
    Ok(w.forward(&t)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Output features per parallel task. Each task is a run of weights read in one stream
/// and a unit of work stealing: 32 made a 1B model's decode step some two thousand tasks,
/// and 128 decodes it 10–15% faster (alternating A/B of the two builds, both orders;
/// SmolLM2 and Gemma 3 unchanged or slightly faster, prefill unchanged).
const CHUNK: usize = 128;
// Layouts interleave rows in pairs (`pair_lanes`) and sixteens (`q4k_lanes`,
// `q6k_lanes`): a chunk must never split a group (sixteen is a multiple of two).
const _: () = assert!(CHUNK.is_multiple_of(16));
/// Activation rows per pass over a chunk's weight rows.
const ACT_TILE: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use sample::Xorshift;

    /// The tiled, parallel product of every format equals each row's portable dot product,
    /// bit for bit, for batch sizes that exercise every tile shape and remainder.
    #[test]
    fn matmul_equals_the_portable_dot_product_of_every_row() {
        let mut rng = Xorshift::new(21);
        let (rows, cols) = (37, 512);
        for format in OwnFormat::ALL {
            let data = sample::weights(format, rows, cols, &mut rng);
            let m = QMatrix::from_blocks(format, data.clone(), rows, cols).unwrap();
            for n in [1, 3, 4, 7, 8, 13, 21] {
                let x = sample::activations(n, cols, 3.0, &mut rng);
                let kernels: Vec<RowKernel> = (0..n)
                    .map(|t| {
                        if t % 3 == 1 {
                            RowKernel::Gemm4
                        } else {
                            RowKernel::Gemv
                        }
                    })
                    .collect();
                let got = m.matmul(&x, &kernels).unwrap();
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let w = &data[r * format.row_bytes(cols)..(r + 1) * format.row_bytes(cols)];
                        let want = (format.dot)(w, xt, kernels[t]);
                        assert_eq!(
                            want.to_bits(),
                            got[t * rows + r].to_bits(),
                            "{format:?}, {n} rows: row {t}, feature {r}"
                        );
                    }
                }
            }
        }
    }
}
