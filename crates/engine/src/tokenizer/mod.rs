//! Tokenizers built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! Two vocabulary kinds are supported, matching llama.cpp's behaviour token for token:
//! - `gpt2`: byte-level BPE with a regex pre-tokenizer (`bpe`),
//! - `llama`: SentencePiece with scores and byte fallback (`spm`).
//!
//! Special tokens (control and user-defined) are split out of the text before the
//! vocabulary-specific algorithm runs, longest first, as llama.cpp does.

mod bpe;
mod chunks;
mod detok;
mod pretokenize;
mod specials;
mod spm;

pub use detok::IncrementalDecoder;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::EngineError;
use crate::gguf::GgufMetadata;
use specials::{Fragment, SpecialSplitter};

/// A token id.
pub type TokenId = u32;

/// Token ids from here on are images' placeholders, not tokens (no vocabulary comes near
/// 2^31): see [`crate::vision::prompt`].
pub const IMAGE_TOKEN_BASE: TokenId = 1 << 31;

/// Whether `id` is an image's placeholder rather than a token.
pub fn is_image_token(id: TokenId) -> bool {
    id >= IMAGE_TOKEN_BASE
}

/// Merges run between two looks at a cancel flag (a few hundred microseconds).
const MERGES_PER_CHECK: usize = 4096;

/// Tokenization was given up because its caller set the cancel flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

/// The role of a token in the vocabulary, from `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Ordinary text piece.
    Normal,
    /// Unknown-token placeholder.
    Unknown,
    /// Control token such as BOS/EOS; never produced from plain text.
    Control,
    /// User-defined token, matched in text before the main algorithm.
    UserDefined,
    /// Unused slot.
    Unused,
    /// Byte-fallback token `<0xXX>`.
    Byte,
}

impl TokenKind {
    fn from_gguf(v: i32) -> Self {
        match v {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Which algorithm turns text into ids.
#[derive(Debug)]
enum Algorithm {
    Bpe(Box<bpe::Bpe>),
    Spm(spm::Spm),
}

/// A tokenizer for one model, built from its GGUF metadata.
#[derive(Debug)]
pub struct Tokenizer {
    pieces: Vec<String>,
    kinds: Vec<TokenKind>,
    piece_to_id: HashMap<String, TokenId>,
    /// Special tokens (control, user-defined, unknown), found in text longest first.
    specials: SpecialSplitter,
    algorithm: Algorithm,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    unknown: Option<TokenId>,
    padding: Option<TokenId>,
    add_bos: bool,
    end_of_generation: Vec<TokenId>,
    fim: Option<FimTokens>,
    chat_template: Option<String>,
}

/// The tokens a fill-in-the-middle prompt is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FimTokens {
    /// Starts the text before the gap.
    pub prefix: TokenId,
    /// Starts the text after the gap.
    pub suffix: TokenId,
    /// Asks for the gap.
    pub middle: TokenId,
}

/// Spellings of the FIM tokens when the metadata does not name them (llama.cpp's list).
const FIM_TEXTS: [(&str, &str, &str); 4] = [
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<PRE>", "<SUF>", "<MID>"),
];

/// Texts of tokens that end a generation, the list llama.cpp detects them by: whatever
/// type the vocabulary gives such a token, llama.cpp makes it a control token too (it then
/// matches in text only as a special token), and so does ferrite.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(meta: &GgufMetadata) -> Result<Self, EngineError> {
        let model = meta.string("tokenizer.ggml.model")?;
        let pieces = meta.string_array("tokenizer.ggml.tokens")?;
        let n = pieces.len();
        let mut kinds: Vec<TokenKind> = match meta.i32_array("tokenizer.ggml.token_type") {
            Ok(v) if v.len() == n => v.into_iter().map(TokenKind::from_gguf).collect(),
            _ => vec![TokenKind::Normal; n],
        };
        let piece_to_id: HashMap<String, TokenId> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as TokenId))
            .collect();
        let end_of_generation_ids: Vec<TokenId> = END_OF_GENERATION_TEXTS
            .iter()
            .filter_map(|text| piece_to_id.get(*text).copied())
            .collect();
        for &id in &end_of_generation_ids {
            kinds[id as usize] = TokenKind::Control;
        }
        let algorithm = match model.as_str() {
            "gpt2" => {
                let merges = meta.string_array("tokenizer.ggml.merges")?;
                let pre = meta.string("tokenizer.ggml.pre").unwrap_or_default();
                Algorithm::Bpe(Box::new(bpe::Bpe::new(&merges, &pre, &piece_to_id)?))
            }
            "llama" => {
                let scores = meta.f32_array("tokenizer.ggml.scores")?;
                let add_space_prefix = meta.bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
                Algorithm::Spm(spm::Spm::new(scores, add_space_prefix, &pieces))
            }
            other => {
                return Err(EngineError::Unsupported(format!(
                    "tokenizer model `{other}` (supported: gpt2, llama)"
                )))
            }
        };
        let mut specials: Vec<TokenId> = (0..n as TokenId)
            .filter(|&i| {
                matches!(
                    kinds[i as usize],
                    TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
                ) && !pieces[i as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(pieces[i as usize].len()));
        let specials = SpecialSplitter::new(
            specials
                .into_iter()
                .map(|i| {
                    let always = kinds[i as usize] == TokenKind::UserDefined;
                    (i, pieces[i as usize].as_str(), always)
                })
                .collect(),
        )?;
        let token = |key: &str| meta.u32(key).ok().filter(|&i| (i as usize) < n);
        let bos = token("tokenizer.ggml.bos_token_id");
        let eos = token("tokenizer.ggml.eos_token_id");
        let unknown = token("tokenizer.ggml.unknown_token_id");
        let padding = token("tokenizer.ggml.padding_token_id");
        let chat_template = meta.string("tokenizer.chat_template").ok();
        let add_bos = meta
            .bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(matches!(algorithm, Algorithm::Spm(_)));
        let mut end_of_generation: Vec<TokenId> = eos.into_iter().collect();
        if let Some(eot) = token("tokenizer.ggml.eot_token_id") {
            end_of_generation.push(eot);
        }
        for id in end_of_generation_ids {
            if !end_of_generation.contains(&id) {
                end_of_generation.push(id);
            }
        }
        let fim = match (
            token("tokenizer.ggml.fim_pre_token_id"),
            token("tokenizer.ggml.fim_suf_token_id"),
            token("tokenizer.ggml.fim_mid_token_id"),
        ) {
            (Some(prefix), Some(suffix), Some(middle)) => Some(FimTokens {
                prefix,
                suffix,
                middle,
            }),
            _ => FIM_TEXTS.iter().find_map(|(p, s, m)| {
                Some(FimTokens {
                    prefix: *piece_to_id.get(*p)?,
                    suffix: *piece_to_id.get(*s)?,
                    middle: *piece_to_id.get(*m)?,
                })
            }),
        };
        Ok(Self {
            fim,
            pieces,
            kinds,
            piece_to_id,
            specials,
            algorithm,
            bos,
            eos,
            unknown,
            padding,
            add_bos,
            end_of_generation,
            chat_template,
        })
    }

    /// The fill-in-the-middle tokens, when the model has them.
    pub fn fim(&self) -> Option<FimTokens> {
        self.fim
    }

    /// A fill-in-the-middle prompt, as llama.cpp builds one: BOS (when the model adds
    /// one), the prefix token and `prefix`, the suffix token and `suffix`, the middle
    /// token. `None` when the model has no FIM tokens.
    pub fn encode_fill_in_middle(&self, prefix: &str, suffix: &str) -> Option<Vec<TokenId>> {
        let fim = self.fim?;
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            ids.push(bos);
        }
        ids.push(fim.prefix);
        ids.extend(self.encode(prefix, false));
        ids.push(fim.suffix);
        ids.extend(self.encode(suffix, false));
        ids.push(fim.middle);
        Some(ids)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The beginning-of-sequence token, if the model has one.
    pub fn bos(&self) -> Option<TokenId> {
        self.bos
    }

    /// The end-of-sequence token, if the model has one.
    pub fn eos(&self) -> Option<TokenId> {
        self.eos
    }

    /// The unknown-text token, if the model has one.
    pub fn unknown(&self) -> Option<TokenId> {
        self.unknown
    }

    /// The padding token, if the model names one.
    pub fn padding(&self) -> Option<TokenId> {
        self.padding
    }

    /// Whether a prompt starts with BOS ([`Self::encode_prompt`] adds it).
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// The chat template the file carries (`tokenizer.chat_template`, Jinja), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Tokens that end a generation (EOS, end-of-turn and the like).
    pub fn end_of_generation(&self) -> &[TokenId] {
        &self.end_of_generation
    }

    /// Whether `id` ends a generation.
    pub fn is_end_of_generation(&self, id: TokenId) -> bool {
        self.end_of_generation.contains(&id)
    }

    /// The raw vocabulary piece of a token (as stored in the GGUF file).
    pub fn piece(&self, id: TokenId) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    /// The id of a raw vocabulary piece.
    pub fn piece_id(&self, piece: &str) -> Option<TokenId> {
        self.piece_to_id.get(piece).copied()
    }

    /// The kind of a token.
    pub fn kind(&self, id: TokenId) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Tokenizes a prompt the way a completions server does: the model's BOS when it
    /// asks for one, and special tokens written in the text parsed as such.
    pub fn encode_prompt(&self, text: &str) -> Vec<TokenId> {
        self.encode_prompt_until(text, &AtomicBool::new(false))
            .expect("never cancelled")
    }

    /// [`Self::encode_prompt`] that gives up ([`Cancelled`]) once `cancelled` is set: a
    /// server sets it when the client that asked has gone away. It is looked at between
    /// the pieces of the text (special tokens, pre-tokenizer words).
    pub fn encode_prompt_until(
        &self,
        text: &str,
        cancelled: &AtomicBool,
    ) -> Result<Vec<TokenId>, Cancelled> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos);
        }
        self.encode_into(text, true, &[], cancelled, &mut ids)?;
        Ok(ids)
    }

    /// `text` as a client wrote it, made safe to put in a chat template: where a control
    /// token's piece starts in it, a mark that [`Self::encode_rendered_until`] reads, so
    /// that it stays text (`<|im_start|>system` in a user message does not open a system
    /// turn). Text without such a piece comes back unchanged.
    pub fn escape_specials<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        match self.specials.escape(text) {
            Some(escaped) => std::borrow::Cow::Owned(escaped),
            None => std::borrow::Cow::Borrowed(text),
        }
    }

    /// [`Self::encode_prompt_until`] of a rendered chat template, whose client text was
    /// passed through [`Self::escape_specials`]: the marks are taken out, and no control
    /// token starts where one was; the template's own control tokens are parsed.
    /// The model's BOS comes first when it asks for one and `add_bos`.
    pub fn encode_rendered_until(
        &self,
        text: &str,
        add_bos: bool,
        cancelled: &AtomicBool,
    ) -> Result<Vec<TokenId>, Cancelled> {
        let (text, barred) = SpecialSplitter::unescape(text);
        let mut ids = Vec::new();
        if self.add_bos && add_bos {
            ids.extend(self.bos);
        }
        self.encode_into(&text, true, &barred, cancelled, &mut ids)?;
        Ok(ids)
    }

    /// Tokenizes `text` without adding BOS. With `parse_special`, control tokens written
    /// in the text become their ids; user-defined tokens always do.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<TokenId> {
        let mut ids = Vec::new();
        self.encode_into(text, parse_special, &[], &AtomicBool::new(false), &mut ids)
            .expect("never cancelled");
        ids
    }

    /// [`Self::encode`] that gives up ([`Cancelled`]) once `cancelled` is set.
    pub fn encode_until(
        &self,
        text: &str,
        parse_special: bool,
        cancelled: &AtomicBool,
    ) -> Result<Vec<TokenId>, Cancelled> {
        let mut ids = Vec::new();
        self.encode_into(text, parse_special, &[], cancelled, &mut ids)?;
        Ok(ids)
    }

    /// Appends `text`'s tokens to `ids`; no control token starts at a byte offset in
    /// `barred` (ascending).
    fn encode_into(
        &self,
        text: &str,
        parse_special: bool,
        barred: &[usize],
        cancelled: &AtomicBool,
        ids: &mut Vec<TokenId>,
    ) -> Result<(), Cancelled> {
        // SentencePiece adds its space prefix to text that starts the input or follows a
        // special token, as llama.cpp does.
        let mut after_special = true;
        for fragment in self.specials.split_barred(text, parse_special, barred) {
            if cancelled.load(Ordering::Relaxed) {
                return Err(Cancelled);
            }
            match fragment {
                Fragment::Token(id) => {
                    ids.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    match &self.algorithm {
                        Algorithm::Bpe(b) => b.encode(t, &self.piece_to_id, cancelled, ids)?,
                        Algorithm::Spm(s) => {
                            s.encode(t, after_special, &self.piece_to_id, cancelled, ids)?
                        }
                    }
                    after_special = false;
                }
            }
        }
        Ok(())
    }

    /// The bytes a token stands for in generated text. Control tokens are empty unless
    /// `include_special`.
    pub fn token_bytes(&self, id: TokenId, include_special: bool) -> Vec<u8> {
        let Some(piece) = self.pieces.get(id as usize) else {
            return Vec::new();
        };
        match self.kinds[id as usize] {
            TokenKind::Control | TokenKind::Unknown | TokenKind::Unused => {
                if include_special {
                    piece.as_bytes().to_vec()
                } else {
                    Vec::new()
                }
            }
            TokenKind::UserDefined => piece.as_bytes().to_vec(),
            TokenKind::Byte | TokenKind::Normal => match &self.algorithm {
                Algorithm::Bpe(_) => bpe::piece_to_bytes(piece),
                Algorithm::Spm(_) => spm::piece_to_bytes(piece),
            },
        }
    }

    /// Decodes ids to text; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[TokenId], include_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend(self.token_bytes(id, include_special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The text each token adds when a prompt's `ids` are decoded in order, so that the
    /// pieces concatenate to the text that was tokenized: a character split across tokens
    /// belongs to the token that completes it, bytes still pending at the end (U+FFFD) to
    /// the last token, and the space a SentencePiece tokenizer puts before text that starts
    /// the input or follows a special token is taken away again (as sentencepiece's own
    /// decoder does). Their running lengths index the decoded prompt.
    pub fn decode_pieces(&self, ids: &[TokenId], include_special: bool) -> Vec<String> {
        let strip_prefix = matches!(&self.algorithm, Algorithm::Spm(s) if s.adds_space_prefix());
        let mut decoder = IncrementalDecoder::new();
        let mut at_text_start = true;
        let mut pieces: Vec<String> = ids
            .iter()
            .map(|&id| {
                let special = matches!(
                    self.kind(id),
                    Some(TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown)
                );
                let mut piece = decoder.push(&self.token_bytes(id, include_special));
                if special {
                    at_text_start = true;
                } else if at_text_start && !piece.is_empty() {
                    if strip_prefix && piece.starts_with(' ') {
                        piece.remove(0);
                    }
                    at_text_start = false;
                }
                piece
            })
            .collect();
        if let Some(last) = pieces.last_mut() {
            last.push_str(&decoder.finish());
        }
        pieces
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::quantized::gguf_file::Value;

    use super::*;

    /// A tiny SentencePiece vocabulary with FIM tokens, named or not in the metadata.
    fn tokenizer(fim_in_metadata: bool) -> Tokenizer {
        let pieces = [
            "<unk>",
            "<s>",
            "</s>",
            "<PRE>",
            "<SUF>",
            "<MID>",
            "\u{2581}a",
            "\u{2581}b",
            "a",
            "b",
            "\u{2581}",
            "<0xC3>",
            "<0xA9>",
        ];
        let kinds = [2, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 6, 6];
        let strings =
            |v: &[&str]| Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect());
        let mut meta: HashMap<String, Value> = HashMap::from([
            ("tokenizer.ggml.model".into(), Value::String("llama".into())),
            ("tokenizer.ggml.tokens".into(), strings(&pieces)),
            (
                "tokenizer.ggml.scores".into(),
                Value::Array((0..pieces.len()).map(|i| Value::F32(-(i as f32))).collect()),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(kinds.iter().map(|&k| Value::I32(k)).collect()),
            ),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(true)),
        ]);
        if fim_in_metadata {
            // Named in the metadata, the ids win over the spellings.
            meta.insert("tokenizer.ggml.fim_pre_token_id".into(), Value::U32(5));
            meta.insert("tokenizer.ggml.fim_suf_token_id".into(), Value::U32(4));
            meta.insert("tokenizer.ggml.fim_mid_token_id".into(), Value::U32(3));
        }
        Tokenizer::from_gguf(&GgufMetadata::from(meta)).unwrap()
    }

    /// Long texts of every kind (prose, runs of one character, base64, random letters,
    /// CJK, whitespace) merged a chunk at a time give the tokens of one whole merge, on
    /// the real vocabularies `scripts/test.sh` puts in ferrite's home (both models', and
    /// the BPE ones of `tests/tokenizers.rs`).
    #[test]
    fn long_texts_merged_in_chunks_match_one_merge_on_real_vocabularies() {
        use rand::{Rng, SeedableRng};
        let home = crate::test_home();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let mut pick = |alphabet: &[char], n: usize| -> String {
            (0..n)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect()
        };
        let letters: Vec<char> = ('a'..='z').chain('A'..='Z').collect();
        let base64: Vec<char> = letters
            .iter()
            .copied()
            .chain('0'..='9')
            .chain(['+', '/'])
            .collect();
        let words = [
            "the ", "quick ", "brown ", "fox, ", "jumps\n", "over ", "lazy ", "dog. ",
        ];
        let prose: String = (0..6000).map(|i| words[i * 7 % 8]).collect();
        let texts = [
            prose.clone(),
            "a".repeat(20_000),
            " ".repeat(5000) + "x",
            "=".repeat(9000),
            pick(&base64, 40_000),
            pick(&letters, 30_000),
            pick(&['字', '中', '文', '，', '。'], 8000),
            format!(
                "{prose}\n\n\t{}\n{}",
                pick(&base64, 5000),
                "😀".repeat(3000)
            ),
        ];
        let files = [
            "models/gemma3-270m.gguf",
            "models/smollm2-135m.gguf",
            "tokenizers/llama3.gguf",
            "tokenizers/qwen2.5.gguf",
            "tokenizers/mistral-nemo.gguf",
        ];
        for file in files {
            let path = home.join(file);
            assert!(
                path.exists(),
                "{} is missing: run scripts/test.sh",
                path.display()
            );
            let gguf = crate::gguf::GgufFile::open(&path).unwrap();
            let chunked = Tokenizer::from_gguf(&gguf.meta).unwrap();
            let mut whole = Tokenizer::from_gguf(&gguf.meta).unwrap();
            match &mut whole.algorithm {
                Algorithm::Bpe(b) => b.never_cut(),
                Algorithm::Spm(s) => s.never_cut(),
            }
            for text in &texts {
                let ids = chunked.encode(text, false);
                assert!(
                    ids == whole.encode(text, false),
                    "{file}: {:?}…",
                    &text[..40]
                );
            }
        }
    }

    #[test]
    fn fim_tokens_come_from_the_spellings_or_the_metadata() {
        let by_text = tokenizer(false);
        assert_eq!(
            by_text.fim(),
            Some(FimTokens {
                prefix: 3,
                suffix: 4,
                middle: 5
            })
        );
        assert_eq!(tokenizer(true).fim().map(|f| f.prefix), Some(5));
    }

    #[test]
    fn a_fill_in_the_middle_prompt_puts_prefix_and_suffix_around_the_gap() {
        let t = tokenizer(false);
        let ids = t.encode_fill_in_middle("a", "b").unwrap();
        let a = t.encode("a", false);
        let b = t.encode("b", false);
        let want: Vec<TokenId> = [vec![1, 3], a, vec![4], b, vec![5]].concat();
        assert_eq!(ids, want);
    }

    #[test]
    fn decoded_pieces_concatenate_to_the_decoded_text() {
        let t = tokenizer(false);
        // BOS, " a", the two bytes of "é", " b".
        let ids = [1, 6, 11, 12, 7];
        // The space the tokenizer put before the text is taken away again.
        let pieces = t.decode_pieces(&ids, false);
        assert_eq!(pieces, ["", "a", "", "é", " b"]);
        let with_special = t.decode_pieces(&ids, true);
        assert_eq!(with_special, ["<s>", "a", "", "é", " b"]);
        // A character never completed is U+FFFD on the last token, as in `decode`.
        let cut = t.decode_pieces(&[6, 11], false);
        assert_eq!(cut, ["a", "\u{FFFD}"]);
        assert_eq!(cut.concat(), t.decode(&[6, 11], false).trim_start());
        assert!(t.decode_pieces(&[], false).is_empty());
        // A prompt's text comes back as it was sent, before and after special tokens.
        for text in ["a b", " a", "a<s>b a", "ab  b"] {
            let ids = t.encode_prompt(text);
            assert_eq!(
                t.decode_pieces(&ids, false).concat(),
                text.replace("<s>", "")
            );
            assert_eq!(t.decode_pieces(&ids, true).concat(), format!("<s>{text}"));
        }
    }
}
