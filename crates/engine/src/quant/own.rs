//! A weight format with kernels of our own, as a matrix of it is multiplied
//! ([`OwnFormat`]: as ggml-cpu's type traits beside ggml's type table,
//! [`super::formats::FORMATS`]): the activations a format's products take, whether its
//! rows round by kernel, its task size, and its layout for this CPU, chosen once, at load
//! ([`OwnFormat::laid_out`]). The rows themselves are in `table.rs`, and a family of the
//! registry (`table4`) makes its members' rows with [`quantized`].

use super::layout::Layout;
use super::{ActivationKind, RowKernel, CHUNK};

/// Lays a `rows × cols` matrix's raw rows out for this CPU's kernels.
pub(super) type LayOut = fn(&[u8], usize, usize) -> Box<dyn Layout>;
/// A format's portable product of one weight row with one f32 activation row, the
/// activations quantized (or rounded) as the format's kernels take them, in the arithmetic
/// of the row's kernel (outside wide micro-batches).
pub(super) type Dot = fn(&[u8], &[f32], RowKernel) -> f32;

/// A weight format with kernels of our own, as a matrix of it is multiplied: a row of the
/// table (the associated constants, and the rows `table4` makes for its family).
pub struct OwnFormat {
    /// ggml's name, and how llama.cpp multiplies it where that is one of two ways
    /// (`Q4_0 repacked`).
    pub name: &'static str,
    /// Values per block.
    pub block_values: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// The activations its products take.
    pub(super) activations: ActivationKind,
    /// Whether a row's result depends on its [`RowKernel`].
    pub(super) rounds_by_kernel: bool,
    /// Output features per parallel task.
    pub(super) chunk_rows: usize,
    /// The layout of a matrix of it on this CPU.
    pub(super) lay_out: LayOut,
    /// Its portable product: what every layout computes, the reference of the tests.
    #[cfg_attr(not(test), expect(dead_code, reason = "the tests' reference"))]
    pub(super) dot: Dot,
    /// Where its f16 scales sit in a block, each with the factor the random blocks of
    /// tests and benchmarks give it (Q4_1's minimum is negative, as real ones are).
    pub(super) scales: &'static [(usize, f32)],
}

impl OwnFormat {
    /// Bytes per row of `cols` values.
    pub fn row_bytes(&self, cols: usize) -> usize {
        cols / self.block_values * self.block_bytes
    }

    /// Values per block.
    pub fn block_len(&self) -> usize {
        self.block_values
    }

    /// Whether it is one of F32, F16 and BF16.
    pub(super) fn is_float(&self) -> bool {
        self.scales.is_empty()
    }

    /// `rows × cols` weights of this format (raw blocks, row after row, sizes already
    /// checked) laid out for this CPU's kernels, its memory in huge pages where the system
    /// allows.
    pub(super) fn laid_out(&self, data: &[u8], rows: usize, cols: usize) -> Box<dyn Layout> {
        let laid = (self.lay_out)(data, rows, cols);
        laid.back_with_huge_pages();
        laid
    }
}

/// A format is its name.
impl PartialEq for OwnFormat {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for OwnFormat {}

impl std::fmt::Debug for OwnFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// A quantized row of the table: one scale at the start of each block unless `scales`
/// says otherwise, the default task size.
pub(super) const fn quantized(
    name: &'static str,
    (block_values, block_bytes): (usize, usize),
    activations: ActivationKind,
    lay_out: LayOut,
    dot: Dot,
) -> OwnFormat {
    OwnFormat {
        name,
        block_values,
        block_bytes,
        activations,
        rounds_by_kernel: matches!(activations, ActivationKind::Q8KByKernel),
        chunk_rows: CHUNK,
        lay_out,
        dot,
        scales: &[(0, 1.0)],
    }
}
