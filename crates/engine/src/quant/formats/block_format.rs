//! The members of the block-of-32 family that the packed and lane layouts have kernels
//! for, as a runtime value: what those layouts still dispatch on.

use super::super::q8::Q8Row;
use super::block32::{block_bytes, dot};
use super::{q4_0, q4_1, q5_0, q8_0};

/// The members the packed and lane layouts have kernels for, as a runtime tag (Q5_1 has
/// its own in the lane layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// [`q4_0::Q4_0`].
    Q4_0,
    /// [`q4_1::Q4_1`].
    Q4_1,
    /// [`q5_0::Q5_0`].
    Q5_0,
    /// [`q8_0::Q8_0`].
    Q8_0,
}

impl BlockFormat {
    /// Bytes per block of 32 values.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => block_bytes::<q4_0::Q4_0>(),
            Self::Q4_1 => block_bytes::<q4_1::Q4_1>(),
            Self::Q5_0 => block_bytes::<q5_0::Q5_0>(),
            Self::Q8_0 => block_bytes::<q8_0::Q8_0>(),
        }
    }

    /// Bytes per row of `cols` values.
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / 32 * self.block_bytes()
    }

    /// The format's [`dot`], in portable code.
    pub fn dot_portable(self, w: &[u8], a: &Q8Row) -> f32 {
        match self {
            Self::Q4_0 => dot::<q4_0::Q4_0>(w, a),
            Self::Q4_1 => dot::<q4_1::Q4_1>(w, a),
            Self::Q5_0 => dot::<q5_0::Q5_0>(w, a),
            Self::Q8_0 => dot::<q8_0::Q8_0>(w, a),
        }
    }
}
