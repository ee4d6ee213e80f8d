//! Random but well-formed weight blocks and activations, for the kernel tests and the
//! kernel benchmark: every byte random except the f16 scales, which are kept small and
//! finite as in real models.

use crate::quant::formats::q4_k;
use crate::quant::formats::q5_k;
use crate::quant::formats::q6_k;
use half::f16;

use super::formats::block32::block_bytes;
use super::formats::q5_1::Q5_1 as Q5_1Block;
use super::OwnFormat;

/// A small deterministic generator (xorshift64*), so tests need no seed plumbing.
pub struct Xorshift(u64);

impl Xorshift {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A float in `[-1, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Where a format's f16 scales sit in its block, and the block's size.
fn scale_offsets(format: OwnFormat) -> (&'static [usize], usize) {
    use super::BlockFormat::*;
    match format {
        OwnFormat::Blocks(Q4_0) | OwnFormat::Q4_0Repacked => (&[0], Q4_0.block_bytes()),
        OwnFormat::Q5_1 => (&[0, 2], block_bytes::<Q5_1Block>()),
        OwnFormat::Blocks(Q4_1) => (&[0, 2], Q4_1.block_bytes()),
        OwnFormat::Blocks(Q5_0) => (&[0], Q5_0.block_bytes()),
        OwnFormat::Blocks(Q8_0) => (&[0], Q8_0.block_bytes()),
        OwnFormat::Q4K => (&[0, 2], q4_k::BYTES),
        OwnFormat::Q5K => (&[0, 2], q5_k::BYTES),
        OwnFormat::Q3K => (&[108], crate::quant::formats::q3_k::BYTES),
        OwnFormat::Q2KRepacked => (&[80, 82], crate::quant::formats::q2_k::BYTES),
        OwnFormat::Iq4Xs => (&[0], crate::quant::formats::iq4_xs::BYTES),
        OwnFormat::Iq4NlRepacked => (&[0], super::iq4::IQ4_NL),
        OwnFormat::Q6K => (&[208], q6_k::BYTES),
        OwnFormat::Listed(f) => unreachable!("{f:?}'s tests make their own blocks"),
        OwnFormat::F32 | OwnFormat::F16 | OwnFormat::Bf16 => {
            unreachable!("float formats have no scales")
        }
    }
}

/// `rows × cols` random weights of `format`, row after row.
pub fn weights(format: OwnFormat, rows: usize, cols: usize, rng: &mut Xorshift) -> Vec<u8> {
    let values = (0..rows * cols).map(|_| rng.next_f32() * 0.05);
    match format {
        OwnFormat::F32 => return values.flat_map(f32::to_le_bytes).collect(),
        OwnFormat::F16 => {
            return values
                .flat_map(|v| f16::from_f32(v).to_le_bytes())
                .collect()
        }
        OwnFormat::Bf16 => {
            return values
                .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let mut data: Vec<u8> = (0..rows * format.row_bytes(cols))
        .map(|_| rng.next_u64() as u8)
        .collect();
    let (offsets, block) = scale_offsets(format);
    for b in data.chunks_exact_mut(block) {
        for &at in offsets {
            let scale = 0.002 + 0.02 * rng.next_f32().abs();
            let scale = if at == 2 && format == OwnFormat::Blocks(super::BlockFormat::Q4_1) {
                -scale * 8.0
            } else {
                scale
            };
            b[at..at + 2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
        }
    }
    data
}

/// `rows × cols` random activations in `[-scale, scale)`.
pub fn activations(rows: usize, cols: usize, scale: f32, rng: &mut Xorshift) -> Vec<f32> {
    (0..rows * cols).map(|_| rng.next_f32() * scale).collect()
}
