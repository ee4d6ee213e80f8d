//! Gemma 3's projector (`clip.projector_type = gemma3`): the image letterboxed into the
//! tower's square (bilinear, black bars), the tower's patch grid averaged over
//! `merge x merge` windows, an RMS norm whose weight holds Gemma's `+1`, and one
//! projection into the text model's width. 896-pixel images in 14-pixel patches give
//! 64x64 patches and 16x16 = 256 image tokens.

use super::image::RgbImage;
use super::resize::{letterbox, Filter};
use super::tower::TowerShape;
use super::{transposed_matrix, ImagePart};
use crate::error::EngineError;
use crate::gguf::GgufFile;
use crate::model::ops;
use crate::quant::{QMatrix, RowKernel};

/// The projector's weights.
pub(super) struct Gemma3 {
    norm: Vec<f32>,
    projection: QMatrix,
    merge: usize,
    eps: f32,
}

impl Gemma3 {
    /// Reads the projector of a tower of `shape`.
    pub fn load(g: &mut GgufFile, shape: &TowerShape) -> Result<Self, EngineError> {
        let merge = g
            .meta
            .u32("clip.vision.projector.scale_factor")
            .unwrap_or(4) as usize;
        if merge == 0 || !shape.grid().is_multiple_of(merge) {
            return Err(EngineError::InvalidModel(format!(
                "Gemma 3 projector pooling {merge}x{merge} over a grid of {} patches",
                shape.grid()
            )));
        }
        Ok(Self {
            norm: g.vector_of("mm.soft_emb_norm.weight", shape.hidden)?,
            projection: transposed_matrix(g, "mm.input_projection.weight", shape.hidden)?,
            merge,
            eps: g.meta.f32("clip.vision.attention.layer_norm_epsilon")?,
        })
    }

    /// The text model's width the projection ends in.
    pub fn text_hidden(&self) -> usize {
        self.projection.rows()
    }

    /// One view, the image letterboxed into the tower's square, between Gemma's image
    /// markers: the same number of tokens for any image.
    pub fn layout(&self, image: &RgbImage, shape: &TowerShape) -> Vec<ImagePart> {
        vec![
            ImagePart::Text("<start_of_image>".into()),
            ImagePart::View {
                pixels: letterbox(image, shape.image_size, Filter::Bilinear),
                tokens: self.tokens(shape),
            },
            ImagePart::Text("<end_of_image>".into()),
        ]
    }

    /// Tokens of the image.
    pub fn tokens(&self, shape: &TowerShape) -> usize {
        (shape.grid() / self.merge).pow(2)
    }

    /// The image tokens' embeddings from the tower's output.
    pub fn project(&self, x: &[f32], shape: &TowerShape) -> Result<Vec<f32>, EngineError> {
        let (g, d, m) = (shape.grid(), shape.hidden, self.merge);
        let side = g / m;
        let mut pooled = vec![0f32; side * side * d];
        for (t, out) in pooled.chunks_exact_mut(d).enumerate() {
            let (ty, tx) = (t / side, t % side);
            for (c, out) in out.iter_mut().enumerate() {
                let mut sum = 0f32;
                for ky in 0..m {
                    for kx in 0..m {
                        sum += x[((ty * m + ky) * g + tx * m + kx) * d + c];
                    }
                }
                *out = sum / (m * m) as f32;
            }
        }
        ops::rms_norm(&mut pooled, &self.norm, self.eps);
        let kernels = vec![RowKernel::GemvInWideBatch; side * side];
        self.projection.matmul(&pooled, &kernels)
    }
}
