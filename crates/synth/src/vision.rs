//! Random-weight vision projectors: the `mmproj` GGUF files (llama.cpp's `clip`
//! architecture) that pair with a text model, written as llama.cpp's converter writes
//! them, so that llama-server's `--mmproj` loads them and answers image requests that a
//! fixture records.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use crate::arch::{Init, TensorSpec};
use crate::gguf_writer::{GgufWriter, TensorData};
use crate::quants::WeightType;
use crate::rng::Rng;

/// A projector type: how the vision transformer's output becomes the text model's
/// embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projector {
    /// Gemma 3: SigLIP, 4x4 average pooling, an RMS norm, one projection.
    Gemma3,
    /// Idefics3 (SmolVLM): SigLIP over tiles and a global view, pixel shuffle, one
    /// projection.
    Idefics3,
    /// Qwen2.5-VL: a tower of its own (two patch kernels summed, RMS norms, 2-D rotary
    /// positions, windowed attention, a SiLU-gated feed-forward), then 2x2 patches merged
    /// by a two-layer GELU projection (`qwen2.5vl_merger`).
    Qwen25Vl,
}

/// A vision tower's size.
#[derive(Debug, Clone, Copy)]
pub struct VisionShape {
    /// Side of the square image the tower reads, in pixels.
    pub image_size: usize,
    /// Side of one patch, in pixels.
    pub patch_size: usize,
    /// Width of the tower's embeddings.
    pub hidden: usize,
    /// Number of transformer blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Side of the pooling window (Gemma 3's average pooling), of the pixel shuffle
    /// (Idefics3's) or of the patch merger (Qwen2.5-VL's, 2).
    pub merge: usize,
    /// The longer side an image is scaled to before it is tiled (Idefics3's
    /// `preproc_image_size`; 0 where the projector does not tile).
    pub longest_edge: usize,
}

impl VisionShape {
    /// Patches per image.
    pub fn patches(&self) -> usize {
        (self.image_size / self.patch_size).pow(2)
    }
}

/// What to generate: a projector of a shape, for a text model `text_hidden` wide.
#[derive(Debug, Clone, Copy)]
pub struct ProjectorSpec {
    /// The projector type.
    pub projector: Projector,
    /// The tower's size.
    pub shape: VisionShape,
    /// Width of the text model's embeddings (the projection's output).
    pub text_hidden: usize,
    /// Type of the 2-D weight matrices (llama.cpp's converter writes `f16`).
    pub weights: WeightType,
    /// The seed of every tensor's values.
    pub seed: u64,
}

impl Projector {
    /// Every projector type.
    pub const ALL: [Self; 3] = [Self::Gemma3, Self::Idefics3, Self::Qwen25Vl];

    /// Its name on the command line and in fixture names.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gemma3 => "gemma3",
            Self::Idefics3 => "idefics3",
            Self::Qwen25Vl => "qwen2.5vl",
        }
    }

    /// The name `clip.projector_type` holds.
    pub fn type_name(self) -> &'static str {
        match self {
            Self::Qwen25Vl => "qwen2.5vl_merger",
            other => other.name(),
        }
    }

    /// The special tokens its prompt layout uses that a text model's vocabulary may lack
    /// (Gemma's tokenizer has its own).
    pub fn added_tokens(self) -> Vec<String> {
        match self {
            Self::Gemma3 => Vec::new(),
            // mtmd writes these two around an image's rows (Qwen's vocabulary has them).
            Self::Qwen25Vl => vec!["<|vision_start|>".into(), "<|vision_end|>".into()],
            Self::Idefics3 => {
                let mut out: Vec<String> = ["<fake_token_around_image>", "<image>", "<global-img>"]
                    .map(String::from)
                    .into();
                for r in 1..=6 {
                    out.extend((1..=6).map(|c| format!("<row_{r}_col_{c}>")));
                }
                out
            }
        }
    }

    /// The projector type called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The small tower tests use, two blocks. Gemma 3: 224-pixel images in 14-pixel
    /// patches (256 patches, 16 image tokens after pooling). Idefics3: 128-pixel tiles in
    /// 16-pixel patches (64 patches, 16 tokens after the 2x2 shuffle), images scaled to
    /// 384 pixels on their longer side first (up to 3x3 tiles). Qwen2.5-VL: any size in
    /// 14-pixel patches, one token per 2x2 of them (a 224-pixel image: 64 tokens, in four
    /// 112-pixel attention windows), the second block attending to the whole image.
    pub fn small_shape(self) -> VisionShape {
        let small = VisionShape {
            image_size: 224,
            patch_size: 14,
            hidden: 128,
            layers: 2,
            heads: 4,
            ffn: 256,
            merge: 4,
            longest_edge: 0,
        };
        match self {
            Self::Gemma3 => small,
            Self::Idefics3 => VisionShape {
                image_size: 128,
                patch_size: 16,
                merge: 2,
                longest_edge: 384,
                ..small
            },
            Self::Qwen25Vl => VisionShape { merge: 2, ..small },
        }
    }

    /// The real model's tower, for benchmarks: Gemma 3 4B's (SigLIP-So400m at 896
    /// pixels), SmolVLM-256M's (SigLIP-B at 512 pixels, 2048-pixel images).
    pub fn full_shape(self) -> VisionShape {
        match self {
            Self::Gemma3 => VisionShape {
                image_size: 896,
                patch_size: 14,
                hidden: 1152,
                layers: 27,
                heads: 16,
                ffn: 4304,
                merge: 4,
                longest_edge: 0,
            },
            Self::Idefics3 => VisionShape {
                image_size: 512,
                patch_size: 16,
                hidden: 768,
                layers: 12,
                heads: 12,
                ffn: 3072,
                merge: 4,
                longest_edge: 2048,
            },
            // Qwen2.5-VL 3B/7B's tower.
            Self::Qwen25Vl => VisionShape {
                image_size: 560,
                patch_size: 14,
                hidden: 1280,
                layers: 32,
                heads: 16,
                ffn: 3420,
                merge: 2,
                longest_edge: 0,
            },
        }
    }

    /// Blocks between two that attend to the whole image (Qwen2.5-VL's
    /// `n_wa_pattern`: its others attend within 112-pixel windows).
    fn window_pattern(s: &VisionShape) -> usize {
        if s.layers >= 8 {
            8
        } else {
            s.layers
        }
    }

    /// The `clip.*` metadata llama.cpp's loader reads, with the types it insists on.
    fn metadata(self, s: &VisionShape, text_hidden: usize) -> Vec<(String, Value)> {
        let half = Value::Array(vec![Value::F32(0.5); 3]);
        let mut out = vec![
            ("general.architecture".into(), Value::String("clip".into())),
            ("general.type".into(), Value::String("mmproj".into())),
            ("clip.has_vision_encoder".into(), Value::Bool(true)),
            (
                "clip.projector_type".into(),
                Value::String(self.type_name().into()),
            ),
            (
                "clip.vision.image_size".into(),
                Value::U32(s.image_size as u32),
            ),
            (
                "clip.vision.patch_size".into(),
                Value::U32(s.patch_size as u32),
            ),
            (
                "clip.vision.embedding_length".into(),
                Value::U32(s.hidden as u32),
            ),
            (
                "clip.vision.feed_forward_length".into(),
                Value::U32(s.ffn as u32),
            ),
            (
                "clip.vision.block_count".into(),
                Value::U32(s.layers as u32),
            ),
            (
                "clip.vision.attention.head_count".into(),
                Value::U32(s.heads as u32),
            ),
            (
                "clip.vision.attention.layer_norm_epsilon".into(),
                Value::F32(1e-6),
            ),
            (
                "clip.vision.projection_dim".into(),
                Value::U32(text_hidden as u32),
            ),
            ("clip.vision.image_mean".into(), half.clone()),
            ("clip.vision.image_std".into(), half),
        ];
        match self {
            // The SigLIP towers' feed-forward is GELU; Qwen2.5-VL's is SiLU-gated, and
            // llama.cpp reads a file without `use_silu` as GELU-quick gated.
            Self::Gemma3 | Self::Idefics3 => {
                out.push(("clip.use_gelu".into(), Value::Bool(true)));
                out.push((
                    "clip.vision.projector.scale_factor".into(),
                    Value::U32(s.merge as u32),
                ));
            }
            Self::Qwen25Vl => {
                out.push(("clip.use_silu".into(), Value::Bool(true)));
                out.push((
                    "clip.vision.n_wa_pattern".into(),
                    Value::U32(Self::window_pattern(s) as u32),
                ));
            }
        }
        if self == Self::Idefics3 && s.longest_edge > 0 {
            out.push((
                "clip.vision.preproc_image_size".into(),
                Value::U32(s.longest_edge as u32),
            ));
        }
        out
    }

    /// Every tensor, in the order llama.cpp's converter writes them (dimensions outermost
    /// first: a linear layer is `[out, in]`).
    fn tensors(self, s: &VisionShape, text_hidden: usize) -> Vec<TensorSpec> {
        if self == Self::Qwen25Vl {
            return qwen25vl_tensors(s, text_hidden);
        }
        let t = |name: &str, dims: Vec<usize>, init| TensorSpec {
            name: name.into(),
            dims,
            init,
        };
        let vector = |center, spread| Init::Vector { center, spread };
        let d = s.hidden;
        let mut out = vec![
            // Pixels lie in [-1, 1]: 3·14·14 of them give each patch values about 0.5 wide.
            t(
                "v.patch_embd.weight",
                vec![d, 3, s.patch_size, s.patch_size],
                Init::Float(0.04),
            ),
            t("v.patch_embd.bias", vec![d], vector(0.0, 0.05)),
            // Smaller than the patches' own values: the image, not the place, leads.
            t(
                "v.position_embd.weight",
                vec![s.patches(), d],
                Init::Float(0.02),
            ),
        ];
        for i in 0..s.layers {
            let p = |n: &str| format!("v.blk.{i}.{n}");
            // Queries and keys about 1 wide after the norm give scores a few units apart:
            // attention that picks patches, so that the answer depends on the image.
            for m in ["attn_q", "attn_k", "attn_v", "attn_out"] {
                out.push(t(
                    &p(&format!("{m}.weight")),
                    vec![d, d],
                    Init::Weight(0.12),
                ));
                out.push(t(&p(&format!("{m}.bias")), vec![d], vector(0.0, 0.05)));
            }
            out.push(t(&p("ln1.weight"), vec![d], vector(1.0, 0.2)));
            out.push(t(&p("ln1.bias"), vec![d], vector(0.0, 0.1)));
            out.push(t(&p("ffn_up.weight"), vec![s.ffn, d], Init::Weight(0.1)));
            out.push(t(&p("ffn_up.bias"), vec![s.ffn], vector(0.0, 0.05)));
            out.push(t(&p("ffn_down.weight"), vec![d, s.ffn], Init::Weight(0.08)));
            out.push(t(&p("ffn_down.bias"), vec![d], vector(0.0, 0.05)));
            out.push(t(&p("ln2.weight"), vec![d], vector(1.0, 0.2)));
            out.push(t(&p("ln2.bias"), vec![d], vector(0.0, 0.1)));
        }
        out.push(t("v.post_ln.weight", vec![d], vector(1.0, 0.2)));
        out.push(t("v.post_ln.bias", vec![d], vector(0.0, 0.1)));
        match self {
            Self::Gemma3 => {
                // Stored as the converter writes it: the vision width outermost (the
                // graph transposes it), the norm's weight with Gemma's +1 already added.
                out.push(t(
                    "mm.input_projection.weight",
                    vec![d, text_hidden],
                    Init::Weight(0.05),
                ));
                out.push(t("mm.soft_emb_norm.weight", vec![d], vector(1.0, 0.2)));
            }
            Self::Idefics3 => out.push(t(
                "mm.model.fc.weight",
                vec![text_hidden, d * s.merge * s.merge],
                Init::Weight(0.04),
            )),
            Self::Qwen25Vl => unreachable!("written by qwen25vl_tensors"),
        }
        out
    }
}

/// Qwen2.5-VL's tensors as llama.cpp's converter writes them: the patch kernel's two
/// temporal halves, no patch bias or position table, RMS norms (weights alone), split
/// query, key and value projections with biases, a SiLU-gated feed-forward with biases,
/// the merger's norm (`v.post_ln`) and its two layers (`mm.0`, `mm.2`).
fn qwen25vl_tensors(s: &VisionShape, text_hidden: usize) -> Vec<TensorSpec> {
    let t = |name: String, dims: Vec<usize>, init| TensorSpec { name, dims, init };
    let vector = |center, spread| Init::Vector { center, spread };
    let (d, merged) = (s.hidden, s.hidden * s.merge * s.merge);
    let kernel = vec![d, 3, s.patch_size, s.patch_size];
    let mut out = vec![
        // Two kernels summed: each half as wide as a SigLIP tower's one.
        t(
            "v.patch_embd.weight".into(),
            kernel.clone(),
            Init::Float(0.03),
        ),
        t("v.patch_embd.weight.1".into(), kernel, Init::Float(0.03)),
    ];
    for i in 0..s.layers {
        let p = |n: &str| format!("v.blk.{i}.{n}");
        out.push(t(p("ln1.weight"), vec![d], vector(1.0, 0.2)));
        for m in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            out.push(t(p(&format!("{m}.weight")), vec![d, d], Init::Weight(0.12)));
            out.push(t(p(&format!("{m}.bias")), vec![d], vector(0.0, 0.05)));
        }
        out.push(t(p("ln2.weight"), vec![d], vector(1.0, 0.2)));
        for (m, dims) in [
            ("ffn_gate", [s.ffn, d]),
            ("ffn_up", [s.ffn, d]),
            ("ffn_down", [d, s.ffn]),
        ] {
            out.push(t(
                p(&format!("{m}.weight")),
                dims.to_vec(),
                Init::Weight(0.1),
            ));
            out.push(t(p(&format!("{m}.bias")), vec![dims[0]], vector(0.0, 0.05)));
        }
    }
    out.push(t("v.post_ln.weight".into(), vec![d], vector(1.0, 0.2)));
    out.push(t(
        "mm.0.weight".into(),
        vec![merged, merged],
        Init::Weight(0.05),
    ));
    out.push(t("mm.0.bias".into(), vec![merged], vector(0.0, 0.05)));
    out.push(t(
        "mm.2.weight".into(),
        vec![text_hidden, merged],
        Init::Weight(0.05),
    ));
    out.push(t("mm.2.bias".into(), vec![text_hidden], vector(0.0, 0.05)));
    out
}

/// Writes the projector `spec` describes to `out`.
pub fn write_projector(spec: &ProjectorSpec, out: &Path) -> io::Result<()> {
    let mut w = GgufWriter::default();
    for (key, value) in spec.projector.metadata(&spec.shape, spec.text_hidden) {
        w.meta(key, value);
    }
    w.meta("general.file_type", Value::U32(spec.weights.file_type()));
    for t in spec.projector.tensors(&spec.shape, spec.text_hidden) {
        w.tensor(tensor_data(spec, t));
    }
    let mut file = BufWriter::new(File::create(out)?);
    w.write(&mut file)?;
    io::Write::flush(&mut file)
}

fn tensor_data(spec: &ProjectorSpec, t: TensorSpec) -> TensorData {
    let mut rng = Rng::for_name(spec.seed, &t.name);
    let n: usize = t.dims.iter().product();
    let (ty, std) = match &t.init {
        Init::Weight(std) => (spec.weights, *std),
        Init::Float(std) => (WeightType::F32, *std),
        Init::Vector { center, spread } => {
            let v: Vec<f32> = (0..n)
                .map(|_| center + spread * (2.0 * rng.next_f32() - 1.0))
                .collect();
            return f32_tensor(t, &v);
        }
        Init::Values(v) => {
            let v = v.clone();
            return f32_tensor(t, &v);
        }
    };
    TensorData {
        name: t.name,
        dims: t.dims,
        ggml_type: ty.ggml_id(),
        bytes: ty.random(&mut rng, n, std),
    }
}

fn f32_tensor(t: TensorSpec, values: &[f32]) -> TensorData {
    TensorData {
        name: t.name,
        dims: t.dims,
        ggml_type: WeightType::F32.ggml_id(),
        bytes: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}
