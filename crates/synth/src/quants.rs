//! Random tensor data in every weight type: whole blocks of random bits, with each block's
//! scales set so the weights it decodes to spread about as widely as the `std` asked for.
//! Any bit pattern is a valid block, so a model need not be quantized from floats: the file
//! exercises every bit of a format's layout, and llama.cpp and ferrite read the same bytes.

use half::{bf16, f16};

use crate::rng::Rng;

/// A tensor type the generator writes (ggml's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // the variants are ggml's type names
pub enum WeightType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
}

impl WeightType {
    /// Every type, in ggml's order.
    pub const ALL: [WeightType; 16] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Iq4Nl,
        Self::Iq4Xs,
        Self::Mxfp4,
    ];

    /// The name llama.cpp's tools use (`q4_k`, `f16`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q2K => "q2_k",
            Self::Q3K => "q3_k",
            Self::Q4K => "q4_k",
            Self::Q5K => "q5_k",
            Self::Q6K => "q6_k",
            Self::Iq4Nl => "iq4_nl",
            Self::Iq4Xs => "iq4_xs",
            Self::Mxfp4 => "mxfp4",
        }
    }

    /// The type of this name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == name.to_ascii_lowercase())
    }

    /// ggml's type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2K => 10,
            Self::Q3K => 11,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Iq4Nl => 20,
            Self::Iq4Xs => 23,
            Self::Bf16 => 30,
            Self::Mxfp4 => 39,
        }
    }

    /// The `general.file_type` (llama.cpp's `LLAMA_FTYPE_*`) of a file of this type.
    pub fn file_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 7,
            Self::Q5_0 => 8,
            Self::Q5_1 => 9,
            Self::Q2K => 10,
            Self::Q3K => 12, // Q3_K_M
            Self::Q4K => 15, // Q4_K_M
            Self::Q5K => 17, // Q5_K_M
            Self::Q6K => 18,
            Self::Iq4Nl => 25,
            Self::Iq4Xs => 30,
            Self::Bf16 => 32,
            Self::Mxfp4 => 38, // MXFP4_MOE, llama-quantize's name for it
        }
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::Bf16 => 1,
            Self::Q4_0
            | Self::Q4_1
            | Self::Q5_0
            | Self::Q5_1
            | Self::Q8_0
            | Self::Iq4Nl
            | Self::Mxfp4 => 32,
            _ => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
            Self::Q4_0 | Self::Iq4Nl => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Iq4Xs => 136,
            Self::Mxfp4 => 17,
        }
    }

    /// `n` random values (a whole number of blocks) spread about `std` around zero.
    pub fn random(self, rng: &mut Rng, n: usize, std: f32) -> Vec<u8> {
        assert!(n.is_multiple_of(self.block_len()), "{n} values of {self:?}");
        let blocks = n / self.block_len();
        let mut out = vec![0u8; blocks * self.block_bytes()];
        rng.fill(&mut out);
        // A uniform value on [-1, 1) has standard deviation 1/√3.
        let uniform = |rng: &mut Rng| (rng.next_f32() * 2.0 - 1.0) * std * 3f32.sqrt();
        match self {
            Self::F32 => {
                for v in out.chunks_exact_mut(4) {
                    v.copy_from_slice(&uniform(rng).to_le_bytes());
                }
            }
            Self::F16 => {
                for v in out.chunks_exact_mut(2) {
                    v.copy_from_slice(&f16::from_f32(uniform(rng)).to_le_bytes());
                }
            }
            Self::Bf16 => {
                for v in out.chunks_exact_mut(2) {
                    v.copy_from_slice(&bf16::from_f32(uniform(rng)).to_le_bytes());
                }
            }
            _ => {
                for block in out.chunks_exact_mut(self.block_bytes()) {
                    self.set_scales(block, rng, std);
                }
            }
        }
        out
    }

    /// Overwrites a random block's scale fields so its values spread about `std`; `spread`
    /// is the standard deviation of (quant × sub-block scale) for uniform random bits.
    fn set_scales(self, block: &mut [u8], rng: &mut Rng, std: f32) {
        // Each block's scale varies a little, as real blocks' do, and its sign is random:
        // most formats' random quants have a mean off zero (q − 8 for q in 0..16 averages
        // −0.5), which would otherwise bias every weight of a matrix the same way.
        let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        let jitter = sign * (0.75 + 0.5 * rng.next_f32());
        let d = |spread: f32| f16::from_f32(std * jitter / spread).to_le_bytes();
        let put = |block: &mut [u8], at: usize, v: [u8; 2]| block[at..at + 2].copy_from_slice(&v);
        let scale_of = |spread: f32| std * jitter / spread;
        match self {
            // w = d·(q − 8), q in 0..16.
            Self::Q4_0 => put(block, 0, d(4.61)),
            // w = d·q + m: m centres q's mean 7.5 on zero.
            Self::Q4_1 => {
                put(block, 0, d(4.61));
                put(block, 2, f16::from_f32(-7.5 * scale_of(4.61)).to_le_bytes());
            }
            // w = d·(q − 16), q in 0..32.
            Self::Q5_0 => put(block, 0, d(9.23)),
            Self::Q5_1 => {
                put(block, 0, d(9.23));
                put(
                    block,
                    2,
                    f16::from_f32(-15.5 * scale_of(9.23)).to_le_bytes(),
                );
            }
            // w = d·q, q a random i8.
            Self::Q8_0 => put(block, 0, d(73.9)),
            // w = d·s·q − dmin·m, s and m in 0..16, q in 0..4: dmin = 1.5·d centres it.
            Self::Q2K => {
                put(block, 80, d(13.0));
                put(block, 82, f16::from_f32(1.5 * scale_of(13.0)).to_le_bytes());
            }
            // w = d·(s − 32)·q, s a 6-bit scale, q in −4..4.
            Self::Q3K => put(block, 108, d(42.0)),
            // w = d·s·q − dmin·m, s and m in 0..64, q in 0..16: dmin = 7.5·d centres it.
            Self::Q4K => {
                put(block, 0, d(170.0));
                put(block, 2, f16::from_f32(7.5 * scale_of(170.0)).to_le_bytes());
            }
            // The same with q in 0..32.
            Self::Q5K => {
                put(block, 0, d(340.0));
                put(
                    block,
                    2,
                    f16::from_f32(15.5 * scale_of(340.0)).to_le_bytes(),
                );
            }
            // w = d·s·(q − 32), s a random i8, q in 0..64.
            Self::Q6K => put(block, 208, d(1369.0)),
            // w = d·kvalues[q], kvalues spanning −127..113.
            Self::Iq4Nl => put(block, 0, d(70.0)),
            // w = d·(s − 32)·kvalues[q], s a 6-bit scale.
            Self::Iq4Xs => put(block, 0, d(1300.0)),
            // w = 2^(e − 128)·kvalues[q], kvalues twice FP4 (E2M1)'s values, spanning
            // −12..12 (spread 5.85): a power-of-two scale, its sign left to the table's.
            Self::Mxfp4 => {
                let exponent = (scale_of(5.85).abs().log2().round() + 128.0).clamp(2.0, 254.0);
                block[0] = exponent as u8;
            }
            Self::F32 | Self::F16 | Self::Bf16 => unreachable!("not a block type"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::Device;

    fn candle_type(t: WeightType) -> Option<GgmlDType> {
        Some(match t {
            WeightType::F32 => GgmlDType::F32,
            WeightType::F16 => GgmlDType::F16,
            WeightType::Bf16 => GgmlDType::BF16,
            WeightType::Q4_0 => GgmlDType::Q4_0,
            WeightType::Q4_1 => GgmlDType::Q4_1,
            WeightType::Q5_0 => GgmlDType::Q5_0,
            WeightType::Q5_1 => GgmlDType::Q5_1,
            WeightType::Q8_0 => GgmlDType::Q8_0,
            WeightType::Q2K => GgmlDType::Q2K,
            WeightType::Q3K => GgmlDType::Q3K,
            WeightType::Q4K => GgmlDType::Q4K,
            WeightType::Q5K => GgmlDType::Q5K,
            WeightType::Q6K => GgmlDType::Q6K,
            WeightType::Iq4Nl | WeightType::Iq4Xs | WeightType::Mxfp4 => return None,
        })
    }

    /// Every type's random values, decoded by candle, spread as asked (within the slack of
    /// random scales) around a mean near zero; and the sizes agree with candle's.
    #[test]
    fn random_values_have_the_spread_asked_for() {
        for t in WeightType::ALL {
            let Some(dtype) = candle_type(t) else {
                continue;
            };
            assert_eq!(dtype.block_size(), t.block_len(), "{t:?}");
            assert_eq!(dtype.type_size(), t.block_bytes(), "{t:?}");
            let n = 256 * 64;
            let bytes = t.random(&mut Rng::new(1), n, 0.02);
            let q = QTensor::new(
                candle_core::quantized::QStorage::from_data(
                    std::borrow::Cow::Owned(bytes),
                    &Device::Cpu,
                    dtype,
                )
                .unwrap(),
                (64, 256),
            )
            .unwrap();
            let v = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mean = v.iter().sum::<f32>() / n as f32;
            let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n as f32).sqrt();
            assert!((0.01..0.04).contains(&std), "{t:?}: std {std}");
            assert!(mean.abs() < 0.01, "{t:?}: mean {mean}");
        }
    }

    /// MXFP4's random values (candle does not read it), decoded as ggml does, spread as
    /// asked around a mean near zero.
    #[test]
    fn random_mxfp4_values_have_the_spread_asked_for() {
        const VALUES: [f32; 16] = [
            0., 1., 2., 3., 4., 6., 8., 12., 0., -1., -2., -3., -4., -6., -8., -12.,
        ];
        let n = 256 * 64;
        let bytes = WeightType::Mxfp4.random(&mut Rng::new(1), n, 0.02);
        let mut v = Vec::with_capacity(n);
        for block in bytes.chunks_exact(17) {
            let scale = 2f32.powi(block[0] as i32 - 128);
            let (lo, hi): (Vec<f32>, Vec<f32>) = block[1..]
                .iter()
                .map(|q| {
                    (
                        scale * VALUES[(q & 15) as usize],
                        scale * VALUES[(q >> 4) as usize],
                    )
                })
                .unzip();
            v.extend(lo);
            v.extend(hi);
        }
        let mean = v.iter().sum::<f32>() / n as f32;
        let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n as f32).sqrt();
        assert!((0.01..0.04).contains(&std), "std {std}");
        assert!(mean.abs() < 0.01, "mean {mean}");
    }
}
