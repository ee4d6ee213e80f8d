//! What every request handler shares: the engine once it is loaded, the served names,
//! and server-wide settings.

use std::sync::OnceLock;

use ferrite_engine::EngineHandle;

use crate::auth::ApiKeys;
use crate::error::ApiError;

/// Shared state of the HTTP server.
pub struct AppState {
    /// Names the model answers to (the first is the canonical one).
    pub names: Vec<String>,
    /// Set once the model is loaded and warmed up.
    pub engine: OnceLock<EngineHandle>,
    /// Drop unknown request fields instead of refusing them.
    pub ignore_unknown_fields: bool,
    /// Unix time the server started.
    pub created: u64,
    /// `system_fingerprint` of every response.
    pub fingerprint: String,
    /// The keys the protected routes need (none: open).
    pub api_keys: ApiKeys,
}

impl AppState {
    /// New state for a model served under `names`; the engine comes later.
    pub fn new(names: Vec<String>, ignore_unknown_fields: bool) -> Self {
        Self {
            names,
            engine: OnceLock::new(),
            ignore_unknown_fields,
            created: unix_now(),
            fingerprint: format!("fp_ferrite_{}", env!("CARGO_PKG_VERSION")),
            api_keys: ApiKeys::default(),
        }
    }

    /// The engine, or 503 while the model is loading.
    pub fn engine(&self) -> Result<&EngineHandle, ApiError> {
        self.engine.get().ok_or_else(|| {
            ApiError::Unavailable("the model is still loading; retry shortly".into())
        })
    }

    /// The canonical served name.
    pub fn model_name(&self) -> &str {
        &self.names[0]
    }

    /// Checks a request's `model`: a served name, `default`, or a path such as
    /// `vendor/models/NAME` whose last segment is a served name.
    pub fn check_model(&self, requested: &str) -> Result<(), ApiError> {
        let last = requested.rsplit('/').next().unwrap_or(requested);
        let matches = |name: &str| self.names.iter().any(|n| n == name);
        if requested == "default" || matches(requested) || matches(last) {
            Ok(())
        } else {
            Err(ApiError::ModelNotFound(requested.to_string()))
        }
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_match_as_documented() {
        let s = AppState::new(vec!["smollm2-135m".into(), "alias".into()], false);
        for ok in [
            "smollm2-135m",
            "alias",
            "default",
            "accounts/x/models/smollm2-135m",
        ] {
            assert!(s.check_model(ok).is_ok(), "{ok}");
        }
        assert_eq!(
            s.check_model("gpt-4"),
            Err(ApiError::ModelNotFound("gpt-4".into()))
        );
    }
}
