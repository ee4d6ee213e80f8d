//! Image resizing as llama.cpp's `mtmd` does it: Pillow's separable resampling in 22-bit
//! fixed point (the horizontal pass first, its result clipped to bytes, then the vertical
//! one), and the letterbox that fits an image into a square without stretching it.

use super::image::RgbImage;

/// Fractional bits of the fixed-point weights: 32 bits less 8 for a byte less 2 of
/// headroom for the sums.
const PRECISION_BITS: u32 = 22;

/// A resampling filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// The triangle filter (support 1).
    Bilinear,
    /// Pillow's cubic filter (support 2, `a = -0.5`).
    Bicubic,
    /// Lanczos with three lobes (support 3).
    Lanczos,
}

impl Filter {
    /// How far from its centre the filter reaches, in input pixels (before widening).
    fn support(self) -> f64 {
        match self {
            Self::Bilinear => 1.0,
            Self::Bicubic => 2.0,
            Self::Lanczos => 3.0,
        }
    }

    /// The filter's weight at distance `x`.
    fn weight(self, x: f64) -> f64 {
        match self {
            Self::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Self::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            // Pillow's window, `[-3, 3)`, over its sinc, `sin(pi x) / (pi x)`.
            Self::Lanczos if (-3.0..3.0).contains(&x) => sinc(x) * sinc(x / 3.0),
            Self::Lanczos => 0.0,
        }
    }
}

/// `sin(pi v) / (pi v)`, one at zero.
fn sinc(v: f64) -> f64 {
    if v == 0.0 {
        1.0
    } else {
        let pv = v * std::f64::consts::PI;
        pv.sin() / pv
    }
}

/// The fixed-point weights of one dimension's resampling: for each output pixel, its first
/// input pixel, how many it reads, and `ksize` weights.
struct Weights {
    bounds: Vec<(usize, usize)>,
    ksize: usize,
    weights: Vec<i32>,
}

impl Weights {
    fn new(filter: Filter, input: usize, output: usize) -> Self {
        let scale = input as f64 / output as f64;
        // Upsampling keeps the filter's width; downsampling widens it against aliasing.
        let filter_scale = scale.max(1.0);
        let support = filter.support() * filter_scale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(output);
        let mut weights = vec![0i32; output * ksize];
        let fixed = f64::from(1u32 << PRECISION_BITS);
        let mut row = vec![0f64; ksize];
        for (xx, out) in weights.chunks_exact_mut(ksize).enumerate() {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filter_scale;
            // C's truncating conversions, as Pillow's.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let count = end.saturating_sub(first);
            let mut total = 0.0;
            for (x, w) in row.iter_mut().enumerate().take(count) {
                *w = filter.weight((x as f64 + first as f64 - center + 0.5) * ss);
                total += *w;
            }
            for (x, o) in out.iter_mut().enumerate().take(count) {
                let w = if total != 0.0 { row[x] / total } else { row[x] };
                // Plus or minus a half, then truncated towards zero.
                *o = (w * fixed + if w < 0.0 { -0.5 } else { 0.5 }) as i32;
            }
            bounds.push((first, count));
        }
        Self {
            bounds,
            ksize,
            weights,
        }
    }

    /// The weighted sum of `count` values `at(first + i)`, rounded and clipped to a byte.
    fn apply(&self, out_index: usize, at: impl Fn(usize) -> u8) -> u8 {
        let (first, count) = self.bounds[out_index];
        let k = &self.weights[out_index * self.ksize..][..count];
        let mut sum: i32 = 1 << (PRECISION_BITS - 1);
        for (i, &w) in k.iter().enumerate() {
            sum = sum.wrapping_add(i32::from(at(first + i)).wrapping_mul(w));
        }
        (sum >> PRECISION_BITS).clamp(0, 255) as u8
    }
}

/// `image` resampled to `width` x `height` with `filter`.
pub fn resize(image: &RgbImage, width: usize, height: usize, filter: Filter) -> RgbImage {
    let (w0, h0) = (image.width, image.height);
    let mut current = image.clone();
    if width != w0 {
        let k = Weights::new(filter, w0, width);
        let mut out = vec![0u8; width * h0 * 3];
        for y in 0..h0 {
            let src = &current.pixels[y * w0 * 3..][..w0 * 3];
            let dst = &mut out[y * width * 3..][..width * 3];
            for x in 0..width {
                for c in 0..3 {
                    dst[x * 3 + c] = k.apply(x, |i| src[i * 3 + c]);
                }
            }
        }
        current = RgbImage::new(width, h0, out);
    }
    if height != h0 {
        let k = Weights::new(filter, h0, height);
        let row = width * 3;
        let mut out = vec![0u8; row * height];
        for y in 0..height {
            for i in 0..row {
                out[y * row + i] = k.apply(y, |yy| current.pixels[yy * row + i]);
            }
        }
        current = RgbImage::new(width, height, out);
    }
    current
}

/// `image` fitted into a `side` x `side` square ([`letterbox_into`]).
pub fn letterbox(image: &RgbImage, side: usize, filter: Filter) -> RgbImage {
    letterbox_into(image, side, side, filter)
}

/// `image` fitted into `width` x `height`: scaled with `filter` until it fills one of
/// them (its sizes rounded up, as `mtmd`'s `PAD_CEIL`), then centred on black (offsets
/// rounded down). An image of that size is returned as it is.
pub fn letterbox_into(image: &RgbImage, width: usize, height: usize, filter: Filter) -> RgbImage {
    if image.width == width && image.height == height {
        return image.clone();
    }
    // In f32, as mtmd computes it.
    let scale = (width as f32 / image.width as f32).min(height as f32 / image.height as f32);
    let fit = |n: usize, most: usize| ((n as f32 * scale).ceil() as usize).min(most);
    let (w, h) = (fit(image.width, width), fit(image.height, height));
    let scaled = resize(image, w, h, filter);
    let mut out = vec![0u8; width * height * 3];
    let (x0, y0) = ((width - w) / 2, (height - h) / 2);
    for y in 0..h {
        let dst = &mut out[((y0 + y) * width + x0) * 3..][..w * 3];
        dst.copy_from_slice(&scaled.pixels[y * w * 3..][..w * 3]);
    }
    RgbImage::new(width, height, out)
}

/// The `width` x `height` part of `image` whose top left pixel is `(x, y)`; the part must
/// lie inside the image.
pub fn crop(image: &RgbImage, x: usize, y: usize, width: usize, height: usize) -> RgbImage {
    debug_assert!(x + width <= image.width && y + height <= image.height);
    let mut out = Vec::with_capacity(width * height * 3);
    for row in y..y + height {
        out.extend_from_slice(&image.pixels[(row * image.width + x) * 3..][..width * 3]);
    }
    RgbImage::new(width, height, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(width: usize, height: usize) -> RgbImage {
        let pixels = (0..width * height * 3)
            .map(|i| ((i * 37 + i / 7) % 256) as u8)
            .collect();
        RgbImage::new(width, height, pixels)
    }

    /// Pillow's own `Image.resize` of this 6x4 image to 4x3 and to 9x5, bilinear,
    /// bicubic and Lanczos (every byte, recorded from Pillow 13): the arithmetic mtmd
    /// copies.
    #[test]
    fn resampling_matches_pillow_byte_for_byte() {
        let image = gradient(6, 4);
        let cases: [(usize, usize, Filter, &[u8]); 6] = [
            (
                4,
                3,
                Filter::Bilinear,
                &[
                    60, 97, 134, 148, 77, 114, 144, 119, 96, 117, 154, 76, 101, 138, 175, 91, 114,
                    151, 167, 91, 128, 158, 147, 104, 141, 178, 104, 114, 151, 188, 110, 122, 159,
                    86, 95, 132,
                ],
            ),
            (
                4,
                3,
                Filter::Bicubic,
                &[
                    50, 95, 132, 157, 68, 113, 145, 123, 91, 113, 161, 71, 101, 139, 181, 79, 115,
                    152, 178, 81, 127, 163, 152, 103, 145, 182, 93, 113, 154, 199, 108, 125, 162,
                    81, 88, 135,
                ],
            ),
            (
                9,
                5,
                Filter::Bilinear,
                &[
                    0, 37, 74, 56, 93, 130, 130, 124, 161, 203, 28, 65, 150, 60, 97, 97, 134, 128,
                    170, 207, 32, 117, 154, 64, 45, 82, 119, 109, 146, 183, 76, 113, 150, 61, 85,
                    122, 134, 107, 144, 170, 80, 117, 176, 65, 89, 131, 138, 111, 137, 174, 84,
                    154, 191, 50, 107, 144, 181, 99, 136, 173, 88, 125, 162, 76, 113, 150, 130,
                    103, 140, 182, 92, 129, 171, 80, 117, 160, 134, 107, 152, 189, 98, 104, 141,
                    101, 121, 158, 157, 127, 164, 201, 82, 119, 156, 88, 125, 162, 124, 131, 168,
                    197, 86, 123, 144, 92, 129, 72, 109, 146, 213, 250, 32, 141, 178, 88, 88, 125,
                    162, 161, 198, 235, 108, 145, 182, 55, 92, 129, 128, 165, 202, 75, 112, 149, 2,
                    40, 77,
                ],
            ),
            (
                9,
                5,
                Filter::Bicubic,
                &[
                    0, 23, 60, 44, 97, 134, 137, 139, 176, 223, 10, 47, 148, 42, 96, 79, 141, 143,
                    185, 227, 14, 118, 154, 56, 29, 66, 131, 127, 162, 199, 69, 111, 148, 39, 69,
                    106, 139, 120, 157, 191, 74, 115, 188, 43, 73, 114, 143, 124, 132, 190, 82,
                    168, 204, 31, 107, 145, 198, 101, 137, 182, 84, 125, 161, 53, 113, 150, 129,
                    104, 140, 205, 88, 129, 173, 57, 117, 166, 135, 105, 167, 213, 97, 90, 126, 88,
                    126, 163, 163, 144, 180, 221, 70, 106, 144, 67, 127, 164, 120, 148, 184, 223,
                    74, 110, 151, 80, 127, 59, 107, 163, 229, 255, 21, 140, 177, 73, 73, 110, 161,
                    179, 216, 255, 110, 146, 183, 38, 77, 114, 136, 183, 220, 73, 116, 153, 0, 26,
                    63,
                ],
            ),
            (
                4,
                3,
                Filter::Lanczos,
                &[
                    47, 100, 132, 159, 62, 115, 150, 121, 87, 109, 170, 68, 101, 139, 187, 75, 119,
                    151, 182, 73, 127, 167, 153, 102, 147, 182, 91, 106, 151, 203, 112, 132, 163,
                    83, 82, 136,
                ],
            ),
            (
                9,
                5,
                Filter::Lanczos,
                &[
                    0, 10, 47, 34, 104, 141, 155, 144, 180, 234, 12, 41, 137, 21, 96, 75, 159, 149,
                    192, 239, 10, 124, 150, 49, 16, 54, 144, 137, 169, 198, 64, 106, 139, 31, 63,
                    101, 142, 125, 160, 211, 71, 114, 177, 36, 68, 108, 147, 128, 124, 202, 85,
                    167, 195, 21, 106, 146, 221, 109, 138, 194, 74, 123, 157, 27, 112, 149, 130,
                    111, 140, 229, 79, 129, 180, 27, 118, 169, 137, 104, 189, 243, 97, 83, 116, 69,
                    130, 169, 162, 151, 184, 230, 82, 102, 141, 45, 126, 163, 119, 156, 190, 236,
                    82, 108, 150, 72, 123, 40, 98, 173, 242, 255, 22, 134, 171, 60, 66, 104, 170,
                    183, 221, 255, 115, 146, 177, 36, 71, 109, 133, 188, 226, 76, 124, 159, 0, 18,
                    50,
                ],
            ),
        ];
        for (w, h, filter, want) in cases {
            let got = resize(&image, w, h, filter);
            assert_eq!((got.width, got.height), (w, h));
            assert_eq!(got.pixels, want, "{w}x{h} {filter:?}");
        }
        // A constant image stays constant through any resize: the weights sum to one.
        let flat = RgbImage::new(7, 5, vec![200; 7 * 5 * 3]);
        for (w, h) in [(3, 2), (11, 9), (7, 1), (1, 5)] {
            for filter in [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos] {
                let r = resize(&flat, w, h, filter);
                assert!(r.pixels.iter().all(|&p| p == 200), "{w}x{h} {filter:?}");
            }
        }
    }

    /// A wide image keeps its aspect: black bars above and below, the picture centred.
    #[test]
    fn letterbox_centres_the_scaled_image_on_black() {
        let image = RgbImage::new(20, 10, vec![255; 20 * 10 * 3]);
        let boxed = letterbox(&image, 8, Filter::Bilinear);
        assert_eq!((boxed.width, boxed.height), (8, 8));
        let row = |y: usize| &boxed.pixels[y * 8 * 3..][..8 * 3];
        // 20x10 at scale 0.4 is 8x4, placed from row 2.
        for y in 0..8 {
            let want = if (2..6).contains(&y) { 255 } else { 0 };
            assert!(row(y).iter().all(|&p| p == want), "row {y}: {:?}", row(y));
        }
    }
}
