//! The table of IQ4_NL and IQ4_XS (`formats/iq4_nl.rs`, `formats/iq4_xs.rs`): 4-bit
//! indices into sixteen non-linear values, which the lane layouts share.

/// The sixteen values an index stands for (`kvalues_iq4nl`).
pub const VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
/// Bytes per IQ4_NL block of 32 values.
pub const IQ4_NL: usize = 18;
