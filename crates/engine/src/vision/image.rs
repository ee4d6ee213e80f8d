//! Images in: the bytes a client sent, decoded to 8-bit RGB within limits checked before
//! any pixel is decoded, so that a small file announcing a huge image (a decompression
//! bomb) costs nothing. PNG, JPEG, WebP and GIF, by the `image` crate; converted to RGB
//! as llama.cpp's `stb_image` converts them (grey replicated, alpha dropped without
//! compositing, 16-bit samples by their high byte).

use std::io::Cursor;

use image::{codecs, AnimationDecoder, DynamicImage, ImageFormat, ImageReader};
use sha2::{Digest, Sha256};

/// An image of 8-bit RGB pixels, row by row, no padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `width * height * 3` bytes: R, G, B of each pixel.
    pub pixels: Vec<u8>,
}

impl RgbImage {
    /// An image of these pixels.
    ///
    /// # Panics
    ///
    /// If `pixels` is not `width * height * 3` bytes long.
    pub fn new(width: usize, height: usize, pixels: Vec<u8>) -> Self {
        assert_eq!(pixels.len(), width * height * 3, "{width}x{height} RGB");
        Self {
            width,
            height,
            pixels,
        }
    }
}

/// What an image may be, checked from its header before it is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Most pixels (width times height).
    pub max_pixels: u64,
    /// Longest side, in pixels.
    pub max_side: u32,
}

impl Default for ImageLimits {
    /// 32 megapixels (a phone camera's photo), sides up to 16,384.
    fn default() -> Self {
        Self {
            max_pixels: 32 * 1024 * 1024,
            max_side: 16_384,
        }
    }
}

/// Why an image was refused. Each says what the client sent wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The bytes are no image of a format this server reads.
    #[error("the data is not a PNG, JPEG, WebP or GIF image")]
    NotAnImage,
    /// The image's header announces no pixels.
    #[error("the image has no pixels ({width}x{height})")]
    Empty {
        /// Width it announces.
        width: u32,
        /// Height it announces.
        height: u32,
    },
    /// The image is larger than the limits allow.
    #[error(
        "the image is {width}x{height} pixels; at most {max_pixels} pixels and {max_side} \
         on a side are allowed"
    )]
    TooLarge {
        /// Width it announces.
        width: u32,
        /// Height it announces.
        height: u32,
        /// The pixel limit.
        max_pixels: u64,
        /// The side limit.
        max_side: u32,
    },
    /// The image has more than one frame.
    #[error("animated images are not supported: send one frame as a still image")]
    Animated,
    /// The bytes start as an image but do not decode (truncated or corrupt).
    #[error("the image could not be decoded: {0}")]
    Corrupt(String),
}

/// The formats this server reads.
const FORMATS: [ImageFormat; 4] = [
    ImageFormat::Png,
    ImageFormat::Jpeg,
    ImageFormat::WebP,
    ImageFormat::Gif,
];

/// The image in `bytes`, decoded to RGB if its header keeps within `limits`.
pub fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<RgbImage, ImageError> {
    let format = image::guess_format(bytes).map_err(|_| ImageError::NotAnImage)?;
    if !FORMATS.contains(&format) {
        return Err(ImageError::NotAnImage);
    }
    let reader = || {
        let mut r = ImageReader::with_format(Cursor::new(bytes), format);
        let mut l = image::Limits::default();
        l.max_image_width = Some(limits.max_side);
        l.max_image_height = Some(limits.max_side);
        // The decoded image, three or four samples of up to two bytes, and the
        // decoder's own buffers: well under four times the RGB size.
        l.max_alloc = Some(limits.max_pixels.saturating_mul(16));
        r.limits(l);
        r
    };
    let corrupt = |e: image::ImageError| match e {
        image::ImageError::Limits(_) => {
            ImageError::Corrupt("it needs more memory than allowed".into())
        }
        other => ImageError::Corrupt(other.to_string()),
    };
    let (width, height) = match reader().into_dimensions() {
        Ok(d) => d,
        Err(image::ImageError::Limits(_)) => {
            // The side limit tripped inside the decoder: report the size it announces.
            let (width, height) = header_size(bytes, format).unwrap_or((u32::MAX, u32::MAX));
            return Err(too_large(width, height, limits));
        }
        Err(e) => return Err(corrupt(e)),
    };
    if width == 0 || height == 0 {
        return Err(ImageError::Empty { width, height });
    }
    if width > limits.max_side
        || height > limits.max_side
        || u64::from(width) * u64::from(height) > limits.max_pixels
    {
        return Err(too_large(width, height, limits));
    }
    if is_animated(bytes, format)? {
        return Err(ImageError::Animated);
    }
    let image = reader().decode().map_err(corrupt)?;
    Ok(to_rgb(image))
}

fn too_large(width: u32, height: u32, limits: &ImageLimits) -> ImageError {
    ImageError::TooLarge {
        width,
        height,
        max_pixels: limits.max_pixels,
        max_side: limits.max_side,
    }
}

/// The size a PNG's header announces, read by hand where the decoder refuses to (its
/// side limit) so that the error can say it.
fn header_size(bytes: &[u8], format: ImageFormat) -> Option<(u32, u32)> {
    let be = |at: usize| Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
    match format {
        ImageFormat::Png => Some((be(16)?, be(20)?)),
        _ => None,
    }
}

/// Whether the image has more than one frame (an animated GIF, APNG or WebP).
fn is_animated(bytes: &[u8], format: ImageFormat) -> Result<bool, ImageError> {
    let corrupt = |e: image::ImageError| ImageError::Corrupt(e.to_string());
    Ok(match format {
        ImageFormat::Png => codecs::png::PngDecoder::new(Cursor::new(bytes))
            .map_err(corrupt)?
            .is_apng()
            .map_err(corrupt)?,
        ImageFormat::WebP => codecs::webp::WebPDecoder::new(Cursor::new(bytes))
            .map_err(corrupt)?
            .has_animation(),
        ImageFormat::Gif => {
            // Frames are decoded one at a time: stop at the second.
            let decoder = codecs::gif::GifDecoder::new(Cursor::new(bytes)).map_err(corrupt)?;
            decoder.into_frames().take(2).count() > 1
        }
        _ => false,
    })
}

/// 8-bit RGB as stb_image gives it: grey replicated, alpha dropped (not composited),
/// 16-bit and float samples by their high byte or clamped.
fn to_rgb(image: DynamicImage) -> RgbImage {
    let (width, height) = (image.width() as usize, image.height() as usize);
    let pixels: Vec<u8> = match image {
        DynamicImage::ImageRgb8(i) => i.into_raw(),
        DynamicImage::ImageRgba8(i) => rgb_of(i.as_raw(), 4, |v| v),
        DynamicImage::ImageLuma8(i) => rgb_of(i.as_raw(), 1, |v| v),
        DynamicImage::ImageLumaA8(i) => rgb_of(i.as_raw(), 2, |v| v),
        DynamicImage::ImageRgb16(i) => rgb_of(i.as_raw(), 3, high_byte),
        DynamicImage::ImageRgba16(i) => rgb_of(i.as_raw(), 4, high_byte),
        DynamicImage::ImageLuma16(i) => rgb_of(i.as_raw(), 1, high_byte),
        DynamicImage::ImageLumaA16(i) => rgb_of(i.as_raw(), 2, high_byte),
        other => other.to_rgb8().into_raw(),
    };
    RgbImage::new(width, height, pixels)
}

fn high_byte(v: u16) -> u8 {
    (v >> 8) as u8
}

/// RGB bytes of pixels `channels` samples wide (1 or 2: grey, grey replicated).
fn rgb_of<T: Copy>(samples: &[T], channels: usize, byte: impl Fn(T) -> u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(samples.len() / channels * 3);
    for px in samples.chunks_exact(channels) {
        if channels < 3 {
            out.extend_from_slice(&[byte(px[0]); 3]);
        } else {
            out.extend(px[..3].iter().map(|&v| byte(v)));
        }
    }
    out
}

/// The SHA-256 of an image's bytes: what identifies it to the embedding cache and the
/// prefix cache (a cryptographic hash, so that no client can make two images collide).
pub fn content_hash(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32, color: image::ColorType, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        image::write_buffer_with_format(
            &mut Cursor::new(&mut out),
            data,
            width,
            height,
            color,
            ImageFormat::Png,
        )
        .unwrap();
        out
    }

    #[test]
    fn grey_and_alpha_convert_as_stb_does() {
        let grey = png(2, 1, image::ColorType::La8, &[10, 0, 200, 255]);
        let rgb = decode(&grey, &ImageLimits::default()).unwrap();
        assert_eq!(rgb.pixels, [10, 10, 10, 200, 200, 200]);
        let rgba = png(1, 1, image::ColorType::Rgba8, &[1, 2, 3, 0]);
        assert_eq!(
            decode(&rgba, &ImageLimits::default()).unwrap().pixels,
            [1, 2, 3]
        );
        let deep = png(
            1,
            1,
            image::ColorType::Rgb16,
            &[0x12, 0x80, 0xff, 0xff, 0x00, 0x7f],
        );
        assert_eq!(
            decode(&deep, &ImageLimits::default()).unwrap().pixels,
            [0x80, 0xff, 0x7f]
        );
    }

    /// A PNG whose header (its CRC made right) announces `width` x `height`.
    fn announcing(width: u32, height: u32) -> Vec<u8> {
        let mut png = png(1, 1, image::ColorType::Rgb8, &[0, 0, 0]);
        png[16..20].copy_from_slice(&width.to_be_bytes());
        png[20..24].copy_from_slice(&height.to_be_bytes());
        // The IHDR chunk's CRC covers its type and data, bytes 12..29.
        let crc = crc32(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        png
    }

    /// PNG's CRC-32 (the reflected polynomial 0xEDB88320), bit by bit.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// A PNG header announcing 60000x60000 pixels is refused from the header, with the
    /// size it announces; nothing is decoded.
    #[test]
    fn a_huge_announced_size_is_refused_before_decoding() {
        let bomb = announcing(60_000, 60_000);
        match decode(&bomb, &ImageLimits::default()) {
            Err(ImageError::TooLarge { width, height, .. }) => {
                assert_eq!((width, height), (60_000, 60_000))
            }
            other => panic!("{other:?}"),
        }
        let small = ImageLimits {
            max_pixels: 15,
            max_side: 100,
        };
        let four_by_four = png(4, 4, image::ColorType::Rgb8, &[0; 48]);
        assert!(matches!(
            decode(&four_by_four, &small),
            Err(ImageError::TooLarge { .. })
        ));
    }

    #[test]
    fn broken_bytes_are_named() {
        let limits = ImageLimits::default();
        assert_eq!(decode(b"hello", &limits), Err(ImageError::NotAnImage));
        assert_eq!(decode(b"", &limits), Err(ImageError::NotAnImage));
        let whole = png(8, 8, image::ColorType::Rgb8, &[7; 192]);
        let cut = &whole[..whole.len() - 30];
        assert!(matches!(decode(cut, &limits), Err(ImageError::Corrupt(_))));
        let empty = announcing(0, 0);
        assert!(matches!(
            decode(&empty, &limits),
            Err(ImageError::Empty { .. } | ImageError::Corrupt(_))
        ));
    }

    #[test]
    fn an_animated_gif_is_refused_and_a_still_one_read() {
        use image::codecs::gif::GifEncoder;
        use image::{Frame, RgbaImage};
        let frames = |n: usize| {
            let mut out = Vec::new();
            {
                let mut enc = GifEncoder::new(&mut out);
                for k in 0..n {
                    let img = RgbaImage::from_pixel(2, 2, image::Rgba([k as u8 * 90, 0, 0, 255]));
                    enc.encode_frame(Frame::new(img)).unwrap();
                }
            }
            out
        };
        let limits = ImageLimits::default();
        assert_eq!(decode(&frames(2), &limits), Err(ImageError::Animated));
        let still = decode(&frames(1), &limits).unwrap();
        assert_eq!((still.width, still.height), (2, 2));
    }
}
