//! Which kernels run, decided once per process: the CPU's features, capped by the
//! `FERRITE_CPU` environment variable. `portable` and `avx2` make a machine with AVX-512
//! run the code paths of an older one end to end (the tests do, so that every path is
//! checked against llama.cpp on any CI machine), `native` (the default) uses all it has.

use std::sync::OnceLock;

/// The instruction sets the kernels may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// AVX2 with FMA and F16C: the 256-bit kernels.
    pub avx2: bool,
    /// AVX-512F besides: attention's 512-bit kernel.
    pub avx512: bool,
    /// AVX-512 VL, BW and VNNI besides: the wide-tile matrix kernels.
    pub vnni: bool,
    /// AVX-512 BW and BF16 besides AVX-512F: BF16 weights' kernels (`vdpbf16ps`, the
    /// instruction whose rounding llama.cpp's BF16 products have on such a CPU).
    pub bf16: bool,
}

/// The most `FERRITE_CPU` lets the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Portable Rust only.
    Portable,
    /// At most AVX2.
    Avx2,
    /// Whatever the CPU has.
    Native,
}

/// The variable that caps the kernels.
pub const ENV: &str = "FERRITE_CPU";

impl Cap {
    /// `portable`, `avx2` or `native` (any case).
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "portable" => Ok(Self::Portable),
            "avx2" => Ok(Self::Avx2),
            "native" | "" => Ok(Self::Native),
            other => Err(format!(
                "{ENV}={other:?}: expected portable, avx2 or native"
            )),
        }
    }

    /// The cap `FERRITE_CPU` asks for (native when unset).
    pub fn from_env() -> Result<Self, String> {
        match std::env::var(ENV) {
            Ok(value) => Self::parse(&value),
            Err(std::env::VarError::NotPresent) => Ok(Self::Native),
            Err(e) => Err(format!("{ENV}: {e}")),
        }
    }
}

impl Features {
    /// What this CPU has.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = avx2 && is_x86_feature_detected!("avx512f");
            let vnni = avx512
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw");
            let bf16 = avx512
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16");
            Self {
                avx2,
                avx512,
                vnni,
                bf16,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Self::NONE
    }

    /// No SIMD at all.
    pub const NONE: Self = Self {
        avx2: false,
        avx512: false,
        vnni: false,
        bf16: false,
    };

    /// These features, at most `cap`.
    pub fn capped(self, cap: Cap) -> Self {
        match cap {
            Cap::Portable => Self::NONE,
            Cap::Avx2 => Self {
                avx512: false,
                vnni: false,
                bf16: false,
                ..self
            },
            Cap::Native => self,
        }
    }

    /// A short name: `avx512-vnni`, `avx512`, `avx2` or `portable`.
    pub fn name(self) -> &'static str {
        match (self.avx2, self.avx512, self.vnni) {
            (true, true, true) => "avx512-vnni",
            (true, true, false) => "avx512",
            (true, false, _) => "avx2",
            _ => "portable",
        }
    }
}

/// The features the kernels use, decided on first use: what the CPU has, capped by
/// `FERRITE_CPU` (a value that cannot be read counts as native; `ferrite serve` refuses
/// it before this is first asked).
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| Features::detect().capped(Cap::from_env().unwrap_or(Cap::Native)))
}

/// What the CPU has, whatever `FERRITE_CPU` says: the kernel tests compare every path the
/// CPU can run with the portable one.
pub fn detected() -> Features {
    static DETECTED: OnceLock<Features> = OnceLock::new();
    *DETECTED.get_or_init(Features::detect)
}

/// For a kernel test: whether the CPU lacks `name` (`available` false), saying that the
/// test is skipped. A CPU without it cannot run that kernel; the end-to-end tests under
/// `FERRITE_CPU` cover the paths it can run.
#[cfg(test)]
pub(crate) fn lacks(available: bool, name: &str) -> bool {
    if !available {
        eprintln!("skipped: this CPU lacks {name}");
    }
    !available
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_and_only_take_away() {
        assert_eq!(Cap::parse("AVX2"), Ok(Cap::Avx2));
        assert_eq!(Cap::parse(" portable "), Ok(Cap::Portable));
        assert_eq!(Cap::parse("native"), Ok(Cap::Native));
        assert!(Cap::parse("avx512").is_err());
        let all = Features {
            avx2: true,
            avx512: true,
            vnni: true,
            bf16: true,
        };
        assert_eq!(all.capped(Cap::Native), all);
        assert!(!all.capped(Cap::Avx2).bf16);
        assert_eq!(all.capped(Cap::Avx2).name(), "avx2");
        assert_eq!(all.capped(Cap::Portable), Features::NONE);
        assert_eq!(Features::NONE.capped(Cap::Native).name(), "portable");
    }
}
