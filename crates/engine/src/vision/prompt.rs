//! Images inside a prompt. Each view of an image (the whole image, or a tile of it) takes
//! a run of prompt positions; in the prompt's token list each of them holds a placeholder
//! id derived from the view's hash (its image's content hash and its index) and its place
//! in the run, above every real token id. The placeholders keep the token
//! list the one key of a sequence's positions (the prefix cache compares it), so two
//! prompts that differ only in an image never share the image's keys and values, and the
//! same image at the same place shares them.

use std::ops::Range;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::image::RgbImage;
use crate::tokenizer::TokenId;

pub use crate::tokenizer::{is_image_token, IMAGE_TOKEN_BASE};

/// The placeholder of position `i` of the image whose content hash is `hash`: 31 bits
/// mixed from the hash's first 64 and the position.
pub fn image_token(hash: &[u8; 32], i: usize) -> TokenId {
    let h = u64::from_le_bytes(hash[..8].try_into().expect("8 bytes"));
    // splitmix64's finaliser: every bit of the hash and the position reaches every bit.
    let mut z = h ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    IMAGE_TOKEN_BASE | (z as TokenId & (IMAGE_TOKEN_BASE - 1))
}

/// The hash of view `index` of the image whose content hash is `content`
/// ([`super::content_hash`]): what its embeddings are cached and its placeholders derived
/// by.
pub fn view_hash(content: &[u8; 32], index: usize) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(content);
    h.update((index as u64).to_le_bytes());
    h.finalize().into()
}

/// A view of an image of a prompt ([`super::ImagePart::View`]), preprocessed, waiting to
/// be encoded.
#[derive(Debug, Clone)]
pub struct PromptImage {
    /// Index in the prompt of its first position.
    pub start: usize,
    /// Positions it takes.
    pub tokens: usize,
    /// The view's hash ([`view_hash`]).
    pub hash: [u8; 32],
    /// The view's pixels, at the tower's input size.
    pub image: Arc<RgbImage>,
}

impl PromptImage {
    /// Its positions in the prompt.
    pub fn span(&self) -> Range<usize> {
        self.start..self.start + self.tokens
    }

    /// Its placeholder ids, in order.
    pub fn placeholders(&self) -> impl Iterator<Item = TokenId> + '_ {
        (0..self.tokens).map(|i| image_token(&self.hash, i))
    }
}

/// `prefix` shortened so that it does not end inside a run of placeholders of `tokens`:
/// a partly matched image shares nothing of itself (a match of some of its 31-bit
/// placeholders is not a match of the image).
pub fn whole_images_prefix(tokens: &[TokenId], prefix: usize) -> usize {
    let mut n = prefix.min(tokens.len());
    while n > 0 && n < tokens.len() && is_image_token(tokens[n]) && is_image_token(tokens[n - 1]) {
        n -= 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_depend_on_the_image_and_the_position() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        assert!(is_image_token(image_token(&a, 0)));
        assert_ne!(image_token(&a, 0), image_token(&b, 0));
        assert_ne!(image_token(&a, 0), image_token(&a, 1));
        assert_eq!(image_token(&a, 7), image_token(&a, 7));
        assert!(!is_image_token(262_143));
    }

    #[test]
    fn a_prefix_never_ends_inside_an_image() {
        let p = |i| image_token(&[9; 32], i);
        let tokens = [5, 6, p(0), p(1), p(2), 7, 8];
        assert_eq!(whole_images_prefix(&tokens, 4), 2);
        assert_eq!(whole_images_prefix(&tokens, 3), 2);
        assert_eq!(whole_images_prefix(&tokens, 5), 5);
        assert_eq!(whole_images_prefix(&tokens, 6), 6);
        assert_eq!(whole_images_prefix(&tokens, 2), 2);
        assert_eq!(whole_images_prefix(&tokens, 7), 7);
    }
}
