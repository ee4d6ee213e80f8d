//! Vision: images turned into embeddings a text model reads in place of tokens, from
//! llama.cpp's `mmproj` files (its `clip` architecture).
//!
//! An image is decoded within limits ([`image`]), resized and normalised as the
//! projector's preprocessing says ([`resize`]) into one or more views (a projector that
//! tiles an image reads each tile and a global view), each run through the vision
//! transformer the projectors share ([`tower`], in SigLIP's and Qwen2.5-VL's kinds) and
//! projected into the text model's width by its projector: one small file each
//! (`gemma3.rs`, `idefics3.rs`, `qwen25vl.rs`), as the text architectures are over the
//! shared decoder.

mod attention;
mod cache;
mod gemma3;
mod idefics3;
pub mod image;
mod layers;
pub mod prompt;
mod qwen25vl;
pub mod resize;
pub mod tower;

use std::path::Path;

pub use cache::EmbeddingCache;
use gemma3::Gemma3;
use idefics3::Idefics3;
pub use image::{content_hash, decode, ImageError, ImageLimits, RgbImage};
use qwen25vl::Qwen25Vl;
use tower::{PatchLayout, Tower, TowerKind};

use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::quant::{OwnFormat, QMatrix};

/// A projector type, as `clip.projector_type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectorKind {
    /// Gemma 3 (4B, 12B, 27B).
    Gemma3,
    /// Idefics3: SmolVLM and SmolVLM2.
    Idefics3,
    /// Qwen2.5-VL (3B, 7B, 32B, 72B).
    Qwen25Vl,
}

impl ProjectorKind {
    /// Every type ferrite reads.
    pub const ALL: [Self; 3] = [Self::Gemma3, Self::Idefics3, Self::Qwen25Vl];

    /// The name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gemma3 => "gemma3",
            Self::Idefics3 => "idefics3",
            Self::Qwen25Vl => "qwen2.5vl_merger",
        }
    }

    /// The tower it sits on.
    fn tower(self) -> TowerKind {
        match self {
            Self::Gemma3 | Self::Idefics3 => TowerKind::Siglip,
            Self::Qwen25Vl => TowerKind::Windowed,
        }
    }

    /// The type the file's `name` names, where ferrite reads it.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One piece of an image's place in a prompt ([`VisionModel::layout`]), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImagePart {
    /// Text around the views, tokenised on its own with special tokens (as `mtmd` adds
    /// it).
    Text(String),
    /// A view of the image, already at the tower's input size, and the prompt positions
    /// its embeddings take.
    View {
        /// The view's pixels.
        pixels: RgbImage,
        /// Its embeddings (prompt positions).
        tokens: usize,
    },
}

/// Bytes to the tower's input: `(byte / 255 - mean) / std` per channel, in f32, as
/// `clip` computes it, laid out plane by plane.
pub(crate) struct Normalize {
    mean: [f32; 3],
    std: [f32; 3],
}

impl Normalize {
    fn load(g: &GgufFile) -> Result<Self, EngineError> {
        let three = |key: &str| -> Result<[f32; 3], EngineError> {
            let v = g.meta.f32_array(key)?;
            v.get(..3)
                .and_then(|v| v.try_into().ok())
                .ok_or_else(|| EngineError::InvalidModel(format!("{key} has {} values", v.len())))
        };
        Ok(Self {
            mean: three("clip.vision.image_mean")?,
            std: three("clip.vision.image_std")?,
        })
    }

    /// The normalised planes of `image`: all of red, then green, then blue.
    pub(crate) fn planar(&self, image: &RgbImage) -> Vec<f32> {
        let n = image.width * image.height;
        let mut out = vec![0f32; 3 * n];
        for (i, px) in image.pixels.chunks_exact(3).enumerate() {
            for c in 0..3 {
                out[c * n + i] = (f32::from(px[c]) / 255.0 - self.mean[c]) / self.std[c];
            }
        }
        out
    }
}

/// A projector's own part.
enum Projector {
    Gemma3(Gemma3),
    Idefics3(Idefics3),
    Qwen25Vl(Qwen25Vl),
}

/// A loaded vision model: the tower and its projector.
pub struct VisionModel {
    tower: Tower,
    projector: Projector,
    normalize: Normalize,
    kind: ProjectorKind,
}

impl VisionModel {
    /// Reads an `mmproj` GGUF file.
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        let mut g = GgufFile::open(path)?;
        if !g.meta.bool("clip.has_vision_encoder").unwrap_or(false) {
            return Err(EngineError::Unsupported(format!(
                "{}: not a vision projector (no `clip.has_vision_encoder`)",
                path.display()
            )));
        }
        let name = g
            .meta
            .string("clip.projector_type")
            .or_else(|_| g.meta.string("clip.vision.projector_type"))?;
        // Named before the tower is read: another type's tower differs too.
        let kind = ProjectorKind::from_name(&name).ok_or_else(|| {
            let read: Vec<_> = ProjectorKind::ALL.iter().map(|k| k.name()).collect();
            EngineError::Unsupported(format!(
                "vision projector type `{name}` (ferrite reads {})",
                read.join(" and ")
            ))
        })?;
        let tower = Tower::load(&mut g, kind.tower())?;
        let shape = tower.shape();
        let projector = match kind {
            ProjectorKind::Gemma3 => Projector::Gemma3(Gemma3::load(&mut g, shape)?),
            ProjectorKind::Idefics3 => Projector::Idefics3(Idefics3::load(&mut g, shape)?),
            ProjectorKind::Qwen25Vl => Projector::Qwen25Vl(Qwen25Vl::load(&mut g, shape)?),
        };
        Ok(Self {
            normalize: Normalize::load(&g)?,
            tower,
            projector,
            kind,
        })
    }

    /// The projector's type.
    pub fn kind(&self) -> ProjectorKind {
        self.kind
    }

    /// Width of the embeddings it gives: the text model's must be the same.
    pub fn text_hidden(&self) -> usize {
        match &self.projector {
            Projector::Gemma3(p) => p.text_hidden(),
            Projector::Idefics3(p) => p.text_hidden(),
            Projector::Qwen25Vl(p) => p.text_hidden(),
        }
    }

    /// Whether an image's embeddings attend to each other in both directions when the
    /// text model reads them (llama.cpp's `mtmd_decode_use_non_causal`).
    pub fn bidirectional(&self) -> bool {
        matches!(self.kind, ProjectorKind::Gemma3)
    }

    /// The width of the grid of rotary positions a view's embeddings take in the text
    /// model (`model::ImageGrid`), for a projector whose text model places them on one
    /// (Qwen2.5-VL's, with M-RoPE).
    pub fn grid_columns(&self, view: &RgbImage) -> Option<usize> {
        match &self.projector {
            Projector::Qwen25Vl(p) => Some(p.grid_columns(view, self.tower.shape())),
            _ => None,
        }
    }

    /// How `image` enters the prompt: its views, preprocessed for the tower, and the text
    /// around them, in order.
    pub fn layout(&self, image: &RgbImage) -> Vec<ImagePart> {
        let shape = self.tower.shape();
        match &self.projector {
            Projector::Gemma3(p) => p.layout(image, shape),
            Projector::Idefics3(p) => p.layout(image, shape),
            Projector::Qwen25Vl(p) => p.layout(image, shape),
        }
    }

    /// The prompt positions an image of `width` x `height` takes (its views'), known
    /// before it is preprocessed.
    pub fn positions(&self, width: usize, height: usize) -> usize {
        let shape = self.tower.shape();
        match &self.projector {
            Projector::Gemma3(p) => p.tokens(shape),
            Projector::Idefics3(p) => p.positions(width, height, shape),
            Projector::Qwen25Vl(p) => p.positions(width, height, shape),
        }
    }

    /// The positions a view takes, if its pixels are a view the tower reads (as
    /// [`Self::layout`] gives them).
    pub fn view_tokens(&self, view: &RgbImage) -> Option<usize> {
        let shape = self.tower.shape();
        let square = view.width == shape.image_size && view.height == shape.image_size;
        match &self.projector {
            Projector::Gemma3(p) => square.then(|| p.tokens(shape)),
            Projector::Idefics3(p) => square.then(|| p.tokens(shape)),
            Projector::Qwen25Vl(p) => p.view_tokens(view, shape),
        }
    }

    /// The embeddings of every view of `image`, in the order of [`Self::layout`]: rows of
    /// [`Self::text_hidden`] values. [`Self::start_encoding`] and
    /// [`Self::continue_encoding`] in one go.
    pub fn encode(&self, image: &RgbImage) -> Result<Vec<f32>, EngineError> {
        let mut rows = Vec::new();
        for part in self.layout(image) {
            if let ImagePart::View { pixels, .. } = part {
                let mut encoding = self.start_encoding(&pixels);
                loop {
                    if let Some(view) = self.continue_encoding(&mut encoding, usize::MAX)? {
                        rows.extend(view);
                        break;
                    }
                }
            }
        }
        Ok(rows)
    }

    /// The encoding of a view ([`ImagePart::View`]), ready for the tower.
    pub fn start_encoding(&self, view: &RgbImage) -> ImageEncoding {
        let shape = self.tower.shape();
        let layout = match &self.projector {
            Projector::Qwen25Vl(p) => p.patch_layout(view, shape),
            _ => PatchLayout::raster(shape.grid(), shape.grid()),
        };
        ImageEncoding {
            run: self.tower.start(self.normalize.planar(view), layout),
        }
    }

    /// Runs the next `patches` patches' share of an encoding's work (see
    /// [`Tower::advance`]): the view's embeddings once it is done.
    pub fn continue_encoding(
        &self,
        encoding: &mut ImageEncoding,
        patches: usize,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        if !self.tower.advance(&mut encoding.run, patches)? {
            return Ok(None);
        }
        let x = encoding.run.output().expect("the tower is done");
        let shape = self.tower.shape();
        match &self.projector {
            Projector::Gemma3(p) => p.project(x, shape).map(Some),
            Projector::Idefics3(p) => p.project(x, shape).map(Some),
            Projector::Qwen25Vl(p) => p.project(x, encoding.run.layout()).map(Some),
        }
    }
}

/// An image part way through the vision model ([`VisionModel::start_encoding`]).
pub struct ImageEncoding {
    run: tower::TowerRun,
}

/// A matrix stored with its input dimension outermost (`[in, out]`, as the converters
/// write some projections) as a `[out, in]` matrix of the same type (f32 or f16).
fn transposed_matrix(g: &mut GgufFile, name: &str, inputs: usize) -> Result<QMatrix, EngineError> {
    let dims = g.dims(name)?;
    let [rows, outputs] = dims[..] else {
        return Err(EngineError::InvalidModel(format!(
            "{name}: {dims:?}, not a matrix"
        )));
    };
    if rows != inputs {
        return Err(EngineError::InvalidModel(format!(
            "{name}: {dims:?}, expected {inputs} rows"
        )));
    }
    let (ty, bytes) = g.raw(name)?;
    let (size, format) = match ty {
        0 => (4, OwnFormat::F32),
        1 => (2, OwnFormat::F16),
        other => {
            return Err(EngineError::Unsupported(format!(
                "{name}: ggml type {other} (f32 or f16 expected)"
            )))
        }
    };
    let mut out = vec![0u8; bytes.len()];
    for i in 0..inputs {
        for o in 0..outputs {
            let (from, to) = ((i * outputs + o) * size, (o * inputs + i) * size);
            out[to..to + size].copy_from_slice(&bytes[from..from + size]);
        }
    }
    QMatrix::from_blocks(format, out, outputs, inputs)
}
