//! Small range checks shared by the validators; each error names its field.

use crate::error::ApiError;

/// A number in `[low, high]` (bounds included), or the default when absent.
pub fn in_range(
    field: &str,
    v: Option<f64>,
    low: f64,
    high: f64,
    default: f64,
) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && (low..=high).contains(&x) => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be between {low} and {high}, got {x}"),
        )),
    }
}

/// A number in `(low, high]`, or the default when absent.
pub fn in_half_open(
    field: &str,
    v: Option<f64>,
    low: f64,
    high: f64,
    default: f64,
) -> Result<f32, ApiError> {
    match v {
        None => Ok(default as f32),
        Some(x) if x.is_finite() && x > low && x <= high => Ok(x as f32),
        Some(x) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be greater than {low} and at most {high}, got {x}"),
        )),
    }
}

/// A non-negative integer.
pub fn non_negative(field: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x >= 0 => Ok(Some(x as usize)),
        Some(x) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be non-negative, got {x}"),
        )),
    }
}

/// An integer in `[low, high]`.
pub fn int_in_range(
    field: &str,
    v: Option<i64>,
    low: i64,
    high: i64,
) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if (low..=high).contains(&x) && x >= 0 => Ok(Some(x as usize)),
        Some(x) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be between {low} and {high}, got {x}"),
        )),
    }
}

/// Token ids as given (non-negative, within u32); the vocabulary is checked later.
pub fn token_ids(field: &str, ids: Vec<i64>) -> Result<Vec<u32>, ApiError> {
    ids.into_iter()
        .map(|t| {
            u32::try_from(t)
                .map_err(|_| ApiError::invalid(field, format!("token id {t} is out of range")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_include_their_bounds_and_name_the_field() {
        assert_eq!(in_range("f", Some(2.0), -2.0, 2.0, 0.0).unwrap(), 2.0);
        assert_eq!(in_range("f", None, -2.0, 2.0, 0.5).unwrap(), 0.5);
        assert!(in_range("f", Some(f64::NAN), -2.0, 2.0, 0.0).is_err());
        assert!(in_half_open("g", Some(0.0), 0.0, 1.0, 1.0).is_err());
        assert_eq!(in_half_open("g", Some(1.0), 0.0, 1.0, 1.0).unwrap(), 1.0);
        assert!(int_in_range("h", Some(21), 0, 20).is_err());
        assert!(non_negative("i", Some(-1)).is_err());
        assert!(token_ids("j", vec![1, -3]).is_err());
    }
}
