//! Random but well-formed weight blocks and activations, for the kernel tests and the
//! kernel benchmark: every byte random except the f16 scales, which are kept small and
//! finite as in real models.

use half::f16;

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

/// `rows × cols` random weights of `format`, row after row: small values for a float
/// format; random bytes but for the f16 scales otherwise, small and finite as in real
/// models.
pub fn weights(format: &OwnFormat, rows: usize, cols: usize, rng: &mut Xorshift) -> Vec<u8> {
    if format.is_float() {
        let values = (0..rows * cols).map(|_| rng.next_f32() * 0.05);
        return match format {
            f if f == OwnFormat::F32 => values.flat_map(f32::to_le_bytes).collect(),
            f if f == OwnFormat::BF16 => values
                .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            _ => values
                .flat_map(|v| f16::from_f32(v).to_le_bytes())
                .collect(),
        };
    }
    let mut data: Vec<u8> = (0..rows * format.row_bytes(cols))
        .map(|_| rng.next_u64() as u8)
        .collect();
    for b in data.chunks_exact_mut(format.block_bytes) {
        for &(at, factor) in format.scales {
            let scale = (0.002 + 0.02 * rng.next_f32().abs()) * factor;
            b[at..at + 2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
        }
    }
    data
}

/// `rows × cols` random activations in `[-scale, scale)`.
pub fn activations(rows: usize, cols: usize, scale: f32, rng: &mut Xorshift) -> Vec<f32> {
    (0..rows * cols).map(|_| rng.next_f32() * scale).collect()
}
