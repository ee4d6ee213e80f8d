//! Images in requests, at the edge: a `data:` URI (or bare base64, as llama-server takes
//! it) to bytes, its MIME type checked, or an `http(s)` URL kept for the fetch that the
//! operator's rules allow (`crate::media`); the request's image count bounded. The bytes
//! are decoded later, off the async workers, by the engine's decoder within the pixel
//! limits ([`decode_all`]). Every error names the field the image came from.

use base64::Engine as _;
use ferrite_engine::vision::{self, ImageLimits, RgbImage};

use crate::error::ApiError;

/// The MIME types a `data:` URI may declare (what the decoder reads; `image/jpg` is a
/// common misspelling clients send).
const IMAGE_TYPES: [&str; 5] = [
    "image/png",
    "image/jpeg",
    "image/jpg",
    "image/webp",
    "image/gif",
];

/// One image of a request, with the field it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// The request field that carried it (`images[1]`, `messages[0].content[2]`).
    pub field: String,
    /// The encoded image, or where to fetch it.
    pub source: ImageSource,
}

/// Where an image's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// In the request (a `data:` URI or base64), decoded.
    Bytes(Vec<u8>),
    /// At an `http` or `https` URL, fetched before the prompt is prepared
    /// ([`crate::media::fetch_urls`]).
    Url(String),
}

/// The server's limits on images (flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageRules {
    /// Most images in one request.
    pub max_images: usize,
    /// Each image's largest size, checked from its header before it is decoded.
    pub limits: ImageLimits,
}

impl Default for ImageRules {
    fn default() -> Self {
        Self {
            max_images: 16,
            limits: ImageLimits::default(),
        }
    }
}

/// The image `reference` (a `data:` URI, bare base64, or an `http(s)` URL) that `field`
/// holds.
pub fn image_input(field: &str, reference: &str) -> Result<ImageInput, ApiError> {
    let reference = reference.trim();
    let lower = reference.get(..8).unwrap_or(reference).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        let (_, rest) = reference.split_once("://").unwrap_or_default();
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        if host.is_empty()
            || reference
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(ApiError::invalid(
                field,
                "the image URL is not a valid http(s) URL",
            ));
        }
        return Ok(ImageInput {
            field: field.to_string(),
            source: ImageSource::Url(reference.to_string()),
        });
    }
    let payload = match reference.strip_prefix("data:") {
        Some(rest) => {
            let (header, payload) = rest.split_once(',').ok_or_else(|| {
                ApiError::invalid(field, "a `data:` URI needs a comma before its data")
            })?;
            let mut parts = header.split(';');
            let mime = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            if !IMAGE_TYPES.contains(&mime.as_str()) {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "unsupported image type {mime:?}: PNG, JPEG, WebP and GIF images are read"
                    ),
                ));
            }
            if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
                return Err(ApiError::invalid(
                    field,
                    "the `data:` URI must be base64 (data:image/png;base64,...)",
                ));
            }
            payload
        }
        None => reference,
    };
    let bytes = decode_base64(payload).ok_or_else(|| {
        ApiError::invalid(field, "the image is neither a `data:` URI nor valid base64")
    })?;
    if bytes.is_empty() {
        return Err(ApiError::invalid(field, "the image is empty"));
    }
    Ok(ImageInput {
        field: field.to_string(),
        source: ImageSource::Bytes(bytes),
    })
}

/// Standard base64, padded or not, whitespace (line breaks of MIME-style base64) ignored.
fn decode_base64(payload: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    let compact: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    STANDARD
        .decode(&compact)
        .or_else(|_| STANDARD_NO_PAD.decode(&compact))
        .ok()
}

/// A 400 naming `field` when a request carries more than `rules` allow.
pub fn check_count(field: &str, count: usize, rules: &ImageRules) -> Result<(), ApiError> {
    if count > rules.max_images {
        return Err(ApiError::invalid(
            field,
            format!(
                "the request has {count} images; this server takes at most {} (--max-images)",
                rules.max_images
            ),
        ));
    }
    Ok(())
}

/// One decoded image of a request, with its content hash.
#[derive(Debug, Clone)]
pub struct DecodedImage {
    /// The field it came from.
    pub field: String,
    /// SHA-256 of its bytes.
    pub hash: [u8; 32],
    /// Its pixels.
    pub image: RgbImage,
}

/// Every image decoded within `rules`' limits (the first that fails is a 400 naming its
/// field).
pub fn decode_all(
    images: &[ImageInput],
    rules: &ImageRules,
) -> Result<Vec<DecodedImage>, ApiError> {
    images
        .iter()
        .map(|input| {
            let ImageSource::Bytes(bytes) = &input.source else {
                // `media::fetch_urls` replaced every URL or refused the request.
                return Err(ApiError::Internal);
            };
            let image = vision::decode(bytes, &rules.limits)
                .map_err(|e| ApiError::invalid(input.field.clone(), e.to_string()))?;
            Ok(DecodedImage {
                field: input.field.clone(),
                hash: vision::content_hash(bytes),
                image,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(e: ApiError) -> (String, String) {
        match e {
            ApiError::InvalidRequest { param, message } => (param.unwrap_or_default(), message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn data_uris_and_bare_base64_give_the_bytes() {
        let bytes = |reference| match image_input("images[0]", reference).unwrap().source {
            ImageSource::Bytes(bytes) => bytes,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            bytes("data:image/png;base64,iVBORw0KGgo=")[..4],
            [0x89, b'P', b'N', b'G']
        );
        assert_eq!(bytes("iVBORw0KGgo").len(), 8);
        assert_eq!(bytes("data:image/jpeg;base64,iVBO\nRw0K\r\nGgo=").len(), 8);
        assert_eq!(
            image_input("images[0]", " https://example.com/cat.png ")
                .unwrap()
                .source,
            ImageSource::Url("https://example.com/cat.png".into())
        );
    }

    #[test]
    fn bad_references_name_the_field() {
        for (reference, says) in [
            ("data:image/png;base64,@@@@", "base64"),
            ("data:image/tiff;base64,AAAA", "unsupported image type"),
            ("data:text/plain;base64,AAAA", "unsupported image type"),
            ("data:image/png,rawbytes", "must be base64"),
            ("data:image/png;base64", "comma"),
            ("https://", "not a valid http(s) URL"),
            ("http:///cat.png", "not a valid http(s) URL"),
            ("http://example.com/a cat.png", "not a valid http(s) URL"),
            ("data:image/png;base64,", "empty"),
        ] {
            let (field, message) =
                param(image_input("messages[0].content[1]", reference).unwrap_err());
            assert_eq!(field, "messages[0].content[1]");
            assert!(message.contains(says), "{reference}: {message}");
        }
        let rules = ImageRules::default();
        assert!(check_count("images", 16, &rules).is_ok());
        let (field, _) = param(check_count("images", 100, &rules).unwrap_err());
        assert_eq!(field, "images");
    }
}
