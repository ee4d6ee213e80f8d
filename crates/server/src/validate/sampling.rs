//! The sampling fields: temperature, truncation, penalties, logit bias, DRY, Mirostat.

use std::sync::Arc;

use ferrite_engine::sampling::{DryParams, MirostatParams, SamplingParams};
use ferrite_protocol::CompletionRequest;

use super::checks::{in_half_open, in_range, int_in_range, token_ids};
use super::FieldLimits;
use crate::error::ApiError;

/// DRY's default sequence breakers.
pub const DEFAULT_DRY_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// Validates the sampling fields of a request: the engine's parameters (seed 0, DRY
/// breaker tokens not yet known) and the DRY breakers as text.
pub fn sampling_options(
    r: &CompletionRequest,
    limits: &FieldLimits,
) -> Result<(SamplingParams, Vec<String>), ApiError> {
    let temperature = in_range("temperature", r.temperature, 0.0, 2.0, 1.0)?;
    let top_p = in_half_open("top_p", r.top_p, 0.0, 1.0, 1.0)?;
    let top_k = match r.top_k {
        None | Some(0) | Some(-1) => None,
        Some(k) if k > 0 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("`top_k` must be positive, 0 or -1, got {k}"),
            ))
        }
    };
    let (dry, dry_breakers) = dry(r, limits.max_dry_breakers)?;
    let params = SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p: in_range("min_p", r.min_p, 0.0, 1.0, 0.0)?,
        typical_p: in_half_open("typical_p", r.typical_p, 0.0, 1.0, 1.0)?,
        repetition_penalty: in_half_open(
            "repetition_penalty",
            r.repetition_penalty,
            0.0,
            2.0,
            1.0,
        )?,
        frequency_penalty: in_range("frequency_penalty", r.frequency_penalty, -2.0, 2.0, 0.0)?,
        presence_penalty: in_range("presence_penalty", r.presence_penalty, -2.0, 2.0, 0.0)?,
        logit_bias: logit_bias(r, limits.max_logit_bias)?,
        dry,
        mirostat: mirostat(r)?,
        seed: 0,
    };
    Ok((params, dry_breakers))
}

/// vLLM's `allowed_token_ids`: a non-empty list of token ids (checked against the
/// vocabulary once the model is known); only they may be sampled.
pub fn allowed_token_ids(
    r: &CompletionRequest,
    max: usize,
) -> Result<Option<Arc<[u32]>>, ApiError> {
    let Some(ids) = &r.allowed_token_ids else {
        return Ok(None);
    };
    if ids.is_empty() {
        return Err(ApiError::invalid(
            "allowed_token_ids",
            "`allowed_token_ids` is empty: it would allow no token at all",
        ));
    }
    if ids.len() > max {
        return Err(ApiError::invalid(
            "allowed_token_ids",
            format!("`allowed_token_ids` may hold at most {max} ids (`--max-allowed-token-ids`)"),
        ));
    }
    let mut ids = token_ids("allowed_token_ids", ids.clone())?;
    ids.sort_unstable();
    ids.dedup();
    Ok(Some(ids.into()))
}

fn logit_bias(r: &CompletionRequest, max: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = &r.logit_bias else {
        return Ok(Vec::new());
    };
    if map.len() > max {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("`logit_bias` may hold at most {max} entries (`--max-logit-bias`)"),
        ));
    }
    map.iter()
        .map(|(key, &bias)| {
            let id: u32 = key.trim().parse().map_err(|_| {
                ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` keys must be token ids, got {key:?}"),
                )
            })?;
            if !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` values must be between -100 and 100, got {bias} for token {id}"),
                ));
            }
            Ok((id, bias as f32))
        })
        .collect()
}

/// DRY, when its multiplier is above 0 (breaker tokens left for the caller to find), and
/// its breakers as text.
fn dry(
    r: &CompletionRequest,
    max_breakers: usize,
) -> Result<(Option<DryParams>, Vec<String>), ApiError> {
    let multiplier = in_range("dry_multiplier", r.dry_multiplier, 0.0, 100.0, 0.0)?;
    let base = in_range("dry_base", r.dry_base, 1.0, 16.0, 1.75)?;
    let allowed_length =
        int_in_range("dry_allowed_length", r.dry_allowed_length, 0, 1024)?.unwrap_or(2);
    let breakers = match &r.dry_sequence_breakers {
        None => DEFAULT_DRY_BREAKERS.iter().map(|s| s.to_string()).collect(),
        Some(list) => {
            if list.len() > max_breakers || list.iter().any(|s| s.is_empty() || s.len() > 64) {
                return Err(ApiError::invalid(
                    "dry_sequence_breakers",
                    format!("`dry_sequence_breakers` must be at most {max_breakers} non-empty strings of at most 64 bytes (`--max-dry-breakers`)"),
                ));
            }
            list.clone()
        }
    };
    // A multiplier of 0 turns DRY off; the other DRY fields then have nothing to act on.
    let params = (multiplier > 0.0).then_some(DryParams {
        multiplier,
        base,
        allowed_length,
        breakers: Vec::new(),
    });
    Ok((params, breakers))
}

fn mirostat(r: &CompletionRequest) -> Result<Option<MirostatParams>, ApiError> {
    let learning_rate = in_half_open("mirostat_lr", r.mirostat_lr, 0.0, 1.0, 0.1)?;
    // Mirostat is on when a target is given; a learning rate alone has nothing to tune.
    let Some(target) = r.mirostat_target else {
        return Ok(None);
    };
    let target = in_half_open("mirostat_target", Some(target), 0.0, 64.0, 5.0)?;
    Ok(Some(MirostatParams {
        target,
        learning_rate,
    }))
}
