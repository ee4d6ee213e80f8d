//! The weight formats ferrite reads, one row each ([`FORMATS`], as ggml's type-traits
//! table): ggml's id and name, the block's geometry, and how a matrix and an embedding of
//! the format are read. Everything that asks "which types does ferrite read, how large is
//! a block, what is type 39 called" asks here.
//!
//! Formats of a family are a type in a file of their own, implementing the family's
//! trait: `table4::Table4` (32 four-bit indices into a table of sixteen values, one scale
//! per block: IQ4_NL, MXFP4), read and laid out by the family; `block32::Block32` (32
//! small integers, an f16 scale and perhaps a minimum: Q4_0 … Q8_0) and
//! `kquant::SuperBlock` (256 values in sub-blocks with scales of their own: Q2_K … Q6_K,
//! IQ4_XS), whose block structs, values and products are in their files. How a matrix of a
//! format is multiplied (its activations, its layout on this CPU) is its row of the
//! kernels' table, `quant/table.rs` (as ggml-cpu's type traits beside ggml's); `table4` makes
//! the rows of its members. A new format of that family is its file and its line below.
//! The floats are rows candle reads, whose matrices `QMatrix::new` gives kernels of our
//! own where llama.cpp's tinyBLAS takes them.

use candle_core::quantized::GgmlDType;

use super::QMatrix;
use crate::error::EngineError;

pub(super) mod block32;
pub(super) mod iq4_nl;
pub(super) mod iq4_xs;
pub(super) mod kquant;
mod mxfp4;
pub(super) mod q2_k;
pub(super) mod q3_k;
pub(super) mod q4_0;
pub(super) mod q4_1;
pub(super) mod q4_k;
pub(super) mod q5_0;
pub(super) mod q5_1;
pub(super) mod q5_k;
pub(super) mod q6_k;
pub(super) mod q8_0;
pub(super) mod table4;

/// Dequantizes one row of a format, appending its values.
pub(super) type Dequantize = fn(&[u8], &mut Vec<f32>);
/// Reads a `rows × cols` matrix from the file's bytes; `None` where there is no kernel
/// for that shape.
pub type ReadRaw = fn(&[u8], usize, usize) -> Option<Result<QMatrix, EngineError>>;

/// How a format's matrices are read.
pub enum MatrixReader {
    /// Through candle's tensor of this type (`QMatrix::new` then picks kernels of our own
    /// where it has them).
    Candle(GgmlDType),
    /// From the file's bytes by ferrite (`rows`, `cols`), with its family's kernels;
    /// `None` where it has no kernel for that shape.
    Raw(ReadRaw),
    /// From the file's bytes by ferrite, multiplied as the kernels' table says
    /// (`OwnFormat::of_raw`, `quant/table.rs`).
    Table,
}

/// One weight format: a row of the registry.
pub struct FormatInfo {
    /// ggml's name (`Q4_K`, `IQ4_XS`).
    pub name: &'static str,
    /// ggml's type id.
    pub ggml_type: u32,
    /// Values per block.
    pub block_values: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// How its matrices are read.
    pub matrix: MatrixReader,
    /// How an embedding's rows are dequantized where candle does not read the format.
    pub(super) dequantize: Option<Dequantize>,
}

impl FormatInfo {
    /// Bytes per row of `cols` values (a multiple of the block).
    pub fn row_bytes(&self, cols: usize) -> usize {
        cols / self.block_values * self.block_bytes
    }

    /// Whether ferrite dequantizes rows of it itself (an embedding candle does not read).
    pub fn reads_rows(&self) -> bool {
        self.dequantize.is_some()
    }
}

/// A format is its ggml type.
impl PartialEq for FormatInfo {
    fn eq(&self, other: &Self) -> bool {
        self.ggml_type == other.ggml_type
    }
}

impl Eq for FormatInfo {}

impl std::fmt::Debug for FormatInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// A row for a format candle reads.
const fn candle(
    name: &'static str,
    ggml_type: u32,
    block: (usize, usize),
    dtype: GgmlDType,
) -> FormatInfo {
    FormatInfo {
        name,
        ggml_type,
        block_values: block.0,
        block_bytes: block.1,
        matrix: MatrixReader::Candle(dtype),
        dequantize: None,
    }
}

/// F16: the vision towers lay its matrices out on their own (`quant/panels.rs`).
pub const F16: FormatInfo = candle("F16", 1, (1, 2), GgmlDType::F16);

/// Every format ferrite reads, in ggml's order of ids.
pub static FORMATS: &[FormatInfo] = &[
    candle("F32", 0, (1, 4), GgmlDType::F32),
    F16,
    q4_0::INFO,
    q4_1::INFO,
    q5_0::INFO,
    q5_1::INFO,
    q8_0::INFO,
    q2_k::INFO,
    q3_k::INFO,
    q4_k::INFO,
    q5_k::INFO,
    q6_k::INFO,
    iq4_nl::INFO,
    iq4_xs::INFO,
    candle("BF16", 30, (1, 2), GgmlDType::BF16),
    mxfp4::INFO,
];

/// The 32 values of sixteen bytes of nibbles (low nibbles the first sixteen), each
/// with bit `j` of `high` as its fifth bit where given, less `offset`.
pub(in crate::quant) fn nibbles(qs: &[u8; 16], high: Option<u32>, offset: i32) -> [i32; 32] {
    let high = high.unwrap_or(0);
    std::array::from_fn(|e| {
        let nibble = if e < 16 {
            qs[e] & 0x0F
        } else {
            qs[e - 16] >> 4
        };
        (nibble as i32 | (((high >> e) & 1) << 4) as i32) - offset
    })
}

/// The whole blocks of a row of a format whose block is `F`.
pub(in crate::quant) fn blocks<F: bytemuck::Pod>(row: &[u8]) -> &[F] {
    let whole = row.len() / size_of::<F>() * size_of::<F>();
    bytemuck::cast_slice(&row[..whole])
}

/// The block `F` at the start of `bytes`.
pub(in crate::quant) fn view<F: bytemuck::Pod>(bytes: &[u8]) -> &F {
    bytemuck::from_bytes(&bytes[..size_of::<F>()])
}

/// The format of ggml type `id`, if ferrite reads it.
pub fn find(id: u32) -> Option<&'static FormatInfo> {
    FORMATS.iter().find(|f| f.ggml_type == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids and names are unique, and candle agrees with the geometry of the formats it reads.
    #[test]
    fn the_table_is_consistent() {
        for (i, f) in FORMATS.iter().enumerate() {
            for g in &FORMATS[i + 1..] {
                assert!(
                    f.ggml_type < g.ggml_type,
                    "{f:?} before {g:?}, ids in order"
                );
                assert_ne!(f.name, g.name);
            }
            match &f.matrix {
                MatrixReader::Candle(dtype) => {
                    assert_eq!(dtype.block_size(), f.block_values, "{f:?}");
                    assert_eq!(dtype.type_size(), f.block_bytes, "{f:?}");
                }
                MatrixReader::Raw(_) | MatrixReader::Table => {
                    assert!(f.dequantize.is_some(), "{f:?} has no embedding")
                }
            }
        }
        assert_eq!(find(23).map(|f| f.name), Some("IQ4_XS"));
        assert!(find(19).is_none());
    }
}
