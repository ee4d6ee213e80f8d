//! The vision towers' layers: linear maps with biases, the two norms (SigLIP's layer
//! norm, Qwen2.5-VL's RMS norm) and the two feed-forwards (GELU, SiLU-gated), with
//! ggml's CPU arithmetic where it rounds.

use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::model::ops;
use crate::quant::{PanelMatrix, QMatrix, RowKernel};

/// A linear layer: a weight matrix and a bias.
pub(super) struct Linear {
    weight: Weight,
    bias: Vec<f32>,
}

/// A tower's weight matrix: F16 in panels (every product takes thousands of rows), any
/// other type as the text models hold it.
enum Weight {
    Panels(PanelMatrix),
    Rows(QMatrix),
}

impl Linear {
    /// Reads `<name>.weight` and `<name>.bias`.
    pub(super) fn load(g: &mut GgufFile, name: &str) -> Result<Self, EngineError> {
        let name_w = format!("{name}.weight");
        let weight = match g.panel_matrix(&name_w)? {
            Some(panels) => Weight::Panels(panels),
            None => Weight::Rows(g.matmul(&name_w)?),
        };
        let bias = g.vector_of(&format!("{name}.bias"), weight.rows())?;
        Ok(Self { weight, bias })
    }

    /// Width of its outputs.
    pub(super) fn outputs(&self) -> usize {
        self.weight.rows()
    }

    /// Width of its inputs.
    pub(super) fn inputs(&self) -> usize {
        self.weight.cols()
    }

    /// `x W^T + b` for every row of `x` (a batch: ggml's batched products).
    pub(super) fn apply(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
        let mut y = match &self.weight {
            Weight::Panels(m) => m.matmul(x),
            Weight::Rows(m) => m.matmul(x, &vec![RowKernel::GemvInWideBatch; rows])?,
        };
        for row in y.chunks_exact_mut(self.bias.len()) {
            ops::add_assign(row, &self.bias);
        }
        Ok(y)
    }
}

impl Weight {
    /// Output features.
    fn rows(&self) -> usize {
        match self {
            Self::Panels(m) => m.rows(),
            Self::Rows(m) => m.rows(),
        }
    }

    /// Input features.
    fn cols(&self) -> usize {
        match self {
            Self::Panels(m) => m.cols(),
            Self::Rows(m) => m.cols(),
        }
    }
}

/// A tower's normalisation: layer norm with a weight and a bias (SigLIP), or RMS norm
/// with a weight (Qwen2.5-VL).
pub(super) enum Norm {
    Layer {
        weight: Vec<f32>,
        bias: Vec<f32>,
        eps: f32,
    },
    Rms {
        weight: Vec<f32>,
        eps: f32,
    },
}

impl Norm {
    /// Reads `<name>.weight` (and `<name>.bias` for a layer norm).
    pub(super) fn load(
        g: &mut GgufFile,
        name: &str,
        width: usize,
        eps: f32,
        rms: bool,
    ) -> Result<Self, EngineError> {
        let weight = g.vector_of(&format!("{name}.weight"), width)?;
        Ok(match rms {
            true => Self::Rms { weight, eps },
            false => Self::Layer {
                weight,
                bias: g.vector_of(&format!("{name}.bias"), width)?,
                eps,
            },
        })
    }

    /// Normalises every row of `x` in place.
    pub(super) fn apply(&self, x: &mut [f32]) {
        match self {
            Self::Layer { weight, bias, eps } => {
                for row in x.chunks_exact_mut(weight.len()) {
                    layer_norm(row, *eps);
                    for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
                        *v = *v * w + b;
                    }
                }
            }
            Self::Rms { weight, eps } => ops::rms_norm(x, weight, *eps),
        }
    }
}

/// ggml's `norm` of one row (its AVX2 order): the mean summed in f64 and rounded to f32,
/// the squared deviations summed eight at a time (each eight reduced in f32 as its lanes
/// pair up) into an f64, then the row scaled by `1/sqrt(variance + eps)`.
fn layer_norm(row: &mut [f32], eps: f32) {
    let n = row.len();
    let mean = (row.iter().map(|&v| f64::from(v)).sum::<f64>() as f32) / n as f32;
    let mut sum = 0f64;
    let whole = n / 8 * 8;
    for chunk in row[..whole].chunks_exact_mut(8) {
        let mut sq = [0f32; 8];
        for (s, v) in sq.iter_mut().zip(chunk.iter_mut()) {
            *v -= mean;
            *s = *v * *v;
        }
        let half: [f32; 4] = std::array::from_fn(|l| sq[l + 4] + sq[l]);
        let (a, b) = (half[0] + half[2], half[1] + half[3]);
        sum += f64::from(a + b);
    }
    for v in &mut row[whole..] {
        *v -= mean;
        sum += f64::from(*v * *v);
    }
    let variance = (sum / n as f64) as f32;
    let scale = 1.0 / (variance + eps).sqrt();
    row.iter_mut().for_each(|v| *v *= scale);
}

/// A block's feed-forward: `down(gelu(up(x)))` (SigLIP, ggml's f16 GELU table) or
/// `down(silu(gate(x)) * up(x))` (Qwen2.5-VL), every layer with its bias.
pub(super) enum FeedForward {
    Gelu {
        up: Linear,
        down: Linear,
    },
    SiluGated {
        gate: Linear,
        up: Linear,
        down: Linear,
    },
}

impl FeedForward {
    /// Reads `<prefix>ffn_up`, `ffn_down` and, when `gated`, `ffn_gate`.
    pub(super) fn load(g: &mut GgufFile, prefix: &str, gated: bool) -> Result<Self, EngineError> {
        let up = Linear::load(g, &format!("{prefix}ffn_up"))?;
        let down = Linear::load(g, &format!("{prefix}ffn_down"))?;
        if up.outputs() != down.inputs() {
            return Err(EngineError::InvalidModel(format!(
                "{prefix}ffn_up gives {} values, ffn_down takes {}",
                up.outputs(),
                down.inputs()
            )));
        }
        Ok(match gated {
            false => Self::Gelu { up, down },
            true => {
                let gate = Linear::load(g, &format!("{prefix}ffn_gate"))?;
                if gate.outputs() != up.outputs() {
                    return Err(EngineError::InvalidModel(format!(
                        "{prefix}ffn_gate gives {} values, ffn_up {}",
                        gate.outputs(),
                        up.outputs()
                    )));
                }
                Self::SiluGated { gate, up, down }
            }
        })
    }

    /// The feed-forward of every row of `x`.
    pub(super) fn apply(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
        match self {
            Self::Gelu { up, down } => {
                let mut h = up.apply(x, rows)?;
                ops::gelu_in_place(&mut h);
                down.apply(&h, rows)
            }
            Self::SiluGated { gate, up, down } => {
                let mut h = gate.apply(x, rows)?;
                ops::silu_mul(&mut h, &up.apply(x, rows)?);
                down.apply(&h, rows)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's norm on rows whose width is and is not a multiple of eight: zero mean, unit
    /// variance, to f32 accuracy.
    #[test]
    fn layer_norm_centres_and_scales() {
        for n in [8, 13, 64] {
            let mut row: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin() * 3.0 + 1.5).collect();
            layer_norm(&mut row, 1e-6);
            let mean: f32 = row.iter().sum::<f32>() / n as f32;
            let var: f32 = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
            assert!(mean.abs() < 1e-6, "{n}: mean {mean}");
            assert!((var - 1.0).abs() < 1e-4, "{n}: variance {var}");
        }
    }
}
