//! The architectures the generator writes: their metadata keys and tensors, as llama.cpp's
//! converter names them, at a small shape of each architecture's own proportions.

use candle_core::quantized::gguf_file::Value;

/// An architecture the generator can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `llama` as Llama 2, SmolLM2 and Mistral write it.
    Llama,
    /// `llama` with Llama 3.1's `llama3` RoPE scaling (a `rope_freqs` tensor).
    Llama3,
    /// `qwen2`: biases on the query, key and value projections.
    Qwen2,
    /// `qwen2vl` (Qwen2-VL's and Qwen2.5-VL's text model): `qwen2` with multi-section
    /// rotary positions (M-RoPE), which are `qwen2`'s for text.
    Qwen2Vl,
    /// `qwen3`: RMS-normed queries and keys per head.
    Qwen3,
    /// `phi3`: fused QKV and gate-up matrices, LongRoPE factors.
    Phi3,
    /// `gemma2`: soft-capped attention and logits, alternating sliding windows.
    Gemma2,
    /// `gemma3`: normed queries and keys, five local layers to one global.
    Gemma3,
}

impl Arch {
    /// Every architecture.
    pub const ALL: [Arch; 8] = [
        Self::Llama,
        Self::Llama3,
        Self::Qwen2,
        Self::Qwen2Vl,
        Self::Qwen3,
        Self::Phi3,
        Self::Gemma2,
        Self::Gemma3,
    ];

    /// The generator's name for it (`llama3` is the file architecture `llama`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Llama3 => "llama3",
            Self::Qwen2 => "qwen2",
            Self::Qwen2Vl => "qwen2vl",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
        }
    }

    /// The architecture of this name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// `general.architecture`.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama3 => "llama",
            other => other.name(),
        }
    }

    /// The small shape tests use: wide enough for every block size (rows of 256), deep
    /// enough that every kind of layer the architecture alternates appears.
    pub fn small_shape(self) -> Shape {
        let base = Shape {
            hidden: 512,
            layers: 4,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
            ffn: 1536,
        };
        match self {
            Self::Llama | Self::Llama3 | Self::Qwen2 | Self::Qwen2Vl | Self::Qwen3 => base,
            // Phi-3's heads are 96 wide and not grouped.
            Self::Phi3 => Shape {
                hidden: 768,
                heads: 8,
                kv_heads: 8,
                head_dim: 96,
                ffn: 2048,
                ..base
            },
            Self::Gemma2 => Shape {
                heads: 4,
                kv_heads: 2,
                head_dim: 128,
                ..base
            },
            // Six layers: five sliding-window layers and a global one.
            Self::Gemma3 => Shape {
                layers: 6,
                heads: 4,
                kv_heads: 1,
                head_dim: 128,
                ..base
            },
        }
    }

    /// Llama-3.2-1B's shape in this architecture (for benchmarks).
    pub fn one_b_shape(self) -> Shape {
        Shape {
            hidden: 2048,
            layers: 16,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            ffn: 8192,
        }
    }

    /// Llama-3.1-8B's shape in this architecture (for benchmarks).
    pub fn eight_b_shape(self) -> Shape {
        Shape {
            hidden: 4096,
            layers: 32,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ffn: 14336,
        }
    }
}

/// A model's size.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Embedding width.
    pub hidden: usize,
    /// Number of blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key-value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Feed-forward width.
    pub ffn: usize,
}

/// Sliding window of the generated Gemma files: small, so fixture prompts cross it.
pub const SLIDING_WINDOW: u32 = 16;
/// Phi-3's original (pre-LongRoPE) context in the generated files.
pub const PHI3_ORIGINAL_CONTEXT: u32 = 4096;

/// What the generator writes for one tensor.
pub enum Init {
    /// A weight matrix or embedding in the file's weight type, values about this wide.
    Weight(f32),
    /// An `f32` vector of values uniform in `center ± spread`.
    Vector {
        /// Mean value.
        center: f32,
        /// Half-width.
        spread: f32,
    },
    /// Fixed `f32` values.
    Values(Vec<f32>),
    /// An `f32` tensor of random values about this wide, whatever the file's type (a
    /// vision tower's patch and position embeddings, which converters keep in `f32`).
    Float(f32),
}

/// One tensor of the model: name, dimensions (outermost first) and contents.
pub struct TensorSpec {
    /// GGUF tensor name.
    pub name: String,
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// How to fill it.
    pub init: Init,
}

impl Arch {
    /// The architecture's hyper-parameter metadata (prefixed by its GGUF name).
    pub fn metadata(self, s: &Shape, vocab: usize) -> Vec<(String, Value)> {
        let a = self.gguf_name();
        let key = |k: &str| format!("{a}.{k}");
        let mut m = vec![
            (key("context_length"), Value::U32(8192)),
            (key("embedding_length"), Value::U32(s.hidden as u32)),
            (key("block_count"), Value::U32(s.layers as u32)),
            (key("feed_forward_length"), Value::U32(s.ffn as u32)),
            (key("attention.head_count"), Value::U32(s.heads as u32)),
            (
                key("attention.head_count_kv"),
                Value::U32(s.kv_heads as u32),
            ),
            (key("attention.key_length"), Value::U32(s.head_dim as u32)),
            (key("attention.value_length"), Value::U32(s.head_dim as u32)),
            (key("rope.dimension_count"), Value::U32(s.head_dim as u32)),
            (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
            (key("vocab_size"), Value::U32(vocab as u32)),
        ];
        let theta = match self {
            Self::Llama => 10_000.0,
            Self::Llama3 => 500_000.0,
            Self::Qwen2 | Self::Qwen2Vl | Self::Qwen3 | Self::Gemma2 | Self::Gemma3 => 1_000_000.0,
            Self::Phi3 => 10_000.0,
        };
        m.push((key("rope.freq_base"), Value::F32(theta)));
        match self {
            // Llama 3.1's scaling is all in the `rope_freqs` tensor: its converter writes
            // no scaling keys.
            Self::Phi3 => {
                m[0].1 = Value::U32(131_072);
                m.push((
                    key("rope.scaling.original_context_length"),
                    Value::U32(PHI3_ORIGINAL_CONTEXT),
                ));
                m.push((key("rope.scaling.attn_factor"), Value::F32(1.190_238)));
            }
            Self::Gemma2 => {
                m.push((key("attention.sliding_window"), Value::U32(SLIDING_WINDOW)));
                m.push((key("attn_logit_softcapping"), Value::F32(50.0)));
                m.push((key("final_logit_softcapping"), Value::F32(30.0)));
            }
            Self::Gemma3 => {
                m.push((key("attention.sliding_window"), Value::U32(SLIDING_WINDOW)));
            }
            // Qwen2-VL's sections (16, 24, 24 of 64 pairs) scaled to the head: the pairs'
            // shares of time, height and width, none for the fourth.
            Self::Qwen2Vl => {
                let pairs = s.head_dim / 2;
                let (h, w) = (pairs * 3 / 8, pairs * 3 / 8);
                let sections = [pairs - h - w, h, w, 0].map(|n| Value::I32(n as i32));
                m.push((
                    key("rope.dimension_sections"),
                    Value::Array(sections.to_vec()),
                ));
            }
            _ => {}
        }
        m
    }

    /// Every tensor, in the order llama.cpp's converter writes them.
    pub fn tensors(self, s: &Shape, vocab: usize) -> Vec<TensorSpec> {
        let t = |name: String, dims: Vec<usize>, init: Init| TensorSpec { name, dims, init };
        let weight =
            |name: String, rows: usize, cols: usize| t(name, vec![rows, cols], Init::Weight(0.05));
        let norm = |name: String, n: usize| {
            t(
                name,
                vec![n],
                Init::Vector {
                    center: 1.0,
                    spread: 0.2,
                },
            )
        };
        let bias = |name: String, n: usize| {
            t(
                name,
                vec![n],
                Init::Vector {
                    center: 0.0,
                    spread: 0.05,
                },
            )
        };
        let (q, kv) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        // Gemma scales the embedding by √hidden: its values are that much smaller, so the
        // blocks' outputs, not the input token, dominate the residual stream either way.
        let embedding_std = match self {
            // Gemma 2's output is always the embedding: a little wider, with a wide output
            // norm below, keeps its logits apart.
            Self::Gemma2 => 0.01,
            Self::Gemma3 => 0.05 / (s.hidden as f32).sqrt(),
            _ => 0.05,
        };
        let mut out = vec![t(
            "token_embd.weight".into(),
            vec![vocab, s.hidden],
            Init::Weight(embedding_std),
        )];
        match self {
            Self::Llama3 => out.push(t(
                "rope_freqs.weight".into(),
                vec![s.head_dim / 2],
                Init::Values(llama3_freq_factors(s.head_dim, 500_000.0)),
            )),
            Self::Phi3 => {
                for which in ["long", "short"] {
                    out.push(t(
                        format!("rope_factors_{which}.weight"),
                        vec![s.head_dim / 2],
                        Init::Vector {
                            center: if which == "long" { 4.0 } else { 1.2 },
                            spread: 0.2,
                        },
                    ));
                }
            }
            _ => {}
        }
        for i in 0..s.layers {
            let p = |n: &str| format!("blk.{i}.{n}");
            out.push(norm(p("attn_norm.weight"), s.hidden));
            if self == Self::Phi3 {
                out.push(weight(p("attn_qkv.weight"), q + 2 * kv, s.hidden));
            } else {
                out.push(weight(p("attn_q.weight"), q, s.hidden));
                out.push(weight(p("attn_k.weight"), kv, s.hidden));
                out.push(weight(p("attn_v.weight"), kv, s.hidden));
            }
            if matches!(self, Self::Qwen2 | Self::Qwen2Vl) {
                out.push(bias(p("attn_q.bias"), q));
                out.push(bias(p("attn_k.bias"), kv));
                out.push(bias(p("attn_v.bias"), kv));
            }
            if matches!(self, Self::Qwen3 | Self::Gemma3) {
                out.push(norm(p("attn_q_norm.weight"), s.head_dim));
                out.push(norm(p("attn_k_norm.weight"), s.head_dim));
            }
            out.push(weight(p("attn_output.weight"), s.hidden, q));
            if matches!(self, Self::Gemma2 | Self::Gemma3) {
                out.push(norm(p("post_attention_norm.weight"), s.hidden));
            }
            out.push(norm(p("ffn_norm.weight"), s.hidden));
            if self == Self::Phi3 {
                out.push(weight(p("ffn_up.weight"), 2 * s.ffn, s.hidden));
            } else {
                out.push(weight(p("ffn_gate.weight"), s.ffn, s.hidden));
                out.push(weight(p("ffn_up.weight"), s.ffn, s.hidden));
            }
            out.push(weight(p("ffn_down.weight"), s.hidden, s.ffn));
            if matches!(self, Self::Gemma2 | Self::Gemma3) {
                out.push(norm(p("post_ffw_norm.weight"), s.hidden));
            }
        }
        let output_norm = match self {
            Self::Gemma2 => Init::Vector {
                center: 10.0,
                spread: 2.0,
            },
            _ => Init::Vector {
                center: 1.0,
                spread: 0.2,
            },
        };
        out.push(t("output_norm.weight".into(), vec![s.hidden], output_norm));
        // Llama, Qwen 3 and Gemma 2 files tie the output matrix to the embedding (llama.cpp
        // reads no other for Gemma 2); the others have their own, wide enough that the
        // greedy token is a clear choice.
        if !matches!(
            self,
            Self::Llama | Self::Llama3 | Self::Qwen3 | Self::Gemma2
        ) {
            out.push(t(
                "output.weight".into(),
                vec![vocab, s.hidden],
                Init::Weight(0.15),
            ));
        }
        out
    }
}

/// The frequency factors Llama 3.1's converter writes for `llama3` RoPE scaling (factor
/// 32, low and high frequency factors 1 and 4, original context 8,192).
fn llama3_freq_factors(head_dim: usize, theta: f64) -> Vec<f32> {
    let (factor, low, high, original) = (32.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let (low_wavelen, high_wavelen) = (original / low, original / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}
