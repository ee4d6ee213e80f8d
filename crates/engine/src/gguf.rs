//! Reading GGUF files: typed metadata access and tensor loading on top of candle's reader.
//! A malformed file (truncated, corrupted, hostile) is an [`EngineError::InvalidModel`]
//! naming the file and the problem: the header's sizes are checked against the file
//! before anything is allocated for them, and a panic inside candle's reader is caught.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;

use crate::quant::QMatrix;
use candle_core::Device;

use crate::EngineError;

/// Panics inside candle's GGUF reader caught so far, in this process. A malformed file
/// must give an error, and it does either way; but each caught panic is a case that
/// candle's reader does not check and ours does not check first: the fuzz targets count
/// one as a finding.
static CAUGHT_PANICS: AtomicU64 = AtomicU64::new(0);

/// How many panics inside candle's GGUF reader were caught (turned into errors) so far.
pub fn caught_panics() -> u64 {
    CAUGHT_PANICS.load(Ordering::Relaxed)
}

/// Where tensor data is read from: a file, or bytes in memory.
trait Source: Read + Seek + Send {}

impl<T: Read + Seek + Send> Source for T {}

/// An open GGUF file: its metadata, tensor directory and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: Box<dyn Source>,
    /// Typed view of the metadata.
    pub meta: GgufMetadata,
    rounds_by_kernel: bool,
}

impl GgufFile {
    /// Opens a GGUF file and reads its header.
    pub fn open(path: &Path) -> Result<Self, EngineError> {
        let file = File::open(path).map_err(|e| {
            EngineError::InvalidModel(format!("cannot open {}: {e}", path.display()))
        })?;
        let size = file.metadata()?.len();
        Self::read(path, Box::new(BufReader::new(file)), size)
    }

    /// Reads a GGUF file held in memory; `name` stands for its path in messages.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self, EngineError> {
        let size = bytes.len() as u64;
        Self::read(Path::new(name), Box::new(Cursor::new(bytes)), size)
    }

    fn read(path: &Path, mut reader: Box<dyn Source>, size: u64) -> Result<Self, EngineError> {
        let bad = |problem: String| {
            EngineError::InvalidModel(format!(
                "{} is not a valid GGUF file: {problem}",
                path.display()
            ))
        };
        let content = catch_unwind(AssertUnwindSafe(|| Content::read(&mut reader)))
            .map_err(|panic| {
                CAUGHT_PANICS.fetch_add(1, Ordering::Relaxed);
                bad(format!(
                    "its header is malformed ({})",
                    panic_message(&panic)
                ))
            })?
            .map_err(|e| bad(describe_type_error(candle_message(e))))?;
        check_tensors(&content, size).map_err(bad)?;
        let meta = GgufMetadata {
            values: content.metadata.clone(),
        };
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
            meta,
            rounds_by_kernel: false,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file has a tensor of this name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Loads a tensor in its stored (possibly quantized) form.
    pub fn qtensor(&mut self, name: &str) -> Result<QTensor, EngineError> {
        if !self.has_tensor(name) {
            return Err(EngineError::InvalidModel(format!(
                "missing tensor `{name}`"
            )));
        }
        let read = catch_unwind(AssertUnwindSafe(|| {
            self.content.tensor(&mut self.reader, name, &Device::Cpu)
        }));
        match read {
            Ok(tensor) => tensor.map_err(|e| {
                EngineError::InvalidModel(format!(
                    "{}: tensor `{name}`: {}",
                    self.path.display(),
                    candle_message(e)
                ))
            }),
            Err(panic) => {
                CAUGHT_PANICS.fetch_add(1, Ordering::Relaxed);
                Err(EngineError::InvalidModel(format!(
                    "{}: tensor `{name}` is malformed ({})",
                    self.path.display(),
                    panic_message(&panic)
                )))
            }
        }
    }

    /// Loads a weight matrix for matrix products.
    pub fn matmul(&mut self, name: &str) -> Result<QMatrix, EngineError> {
        let m = QMatrix::new(self.qtensor(name)?)?;
        self.rounds_by_kernel |= m.rounds_by_kernel();
        Ok(m)
    }

    /// Whether a matrix loaded so far rounds a row differently by its [`RowKernel`]
    /// (so a prompt row's result depends on how the prompt is batched).
    ///
    /// [`RowKernel`]: crate::quant::RowKernel
    pub fn rounds_by_kernel(&self) -> bool {
        self.rounds_by_kernel
    }

    /// The dimensions of a tensor (outermost first: `[rows, cols]` for a matrix).
    pub fn dims(&self, name: &str) -> Result<Vec<usize>, EngineError> {
        self.content
            .tensor_infos
            .get(name)
            .map(|info| info.shape.dims().to_vec())
            .ok_or_else(|| EngineError::InvalidModel(format!("missing tensor `{name}`")))
    }

    /// Checks that a tensor has the dimensions the model's hyper-parameters imply.
    pub fn expect_dims(&self, name: &str, want: &[usize]) -> Result<(), EngineError> {
        let dims = self.dims(name)?;
        if dims != want {
            return Err(EngineError::InvalidModel(format!(
                "{}: tensor `{name}` is {dims:?}, but the metadata implies {want:?}",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// [`Self::matmul`] after checking the matrix is `rows × cols`.
    pub fn matmul_shaped(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<QMatrix, EngineError> {
        self.expect_dims(name, &[rows, cols])?;
        self.matmul(name)
    }

    /// [`Self::vector`] after checking it holds `len` values.
    pub fn vector_of(&mut self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        self.expect_dims(name, &[len])?;
        self.vector(name)
    }

    /// Loads a small tensor (a norm weight, say) as plain `f32` values.
    pub fn vector(&mut self, name: &str) -> Result<Vec<f32>, EngineError> {
        let t = self.qtensor(name)?.dequantize(&Device::Cpu)?;
        Ok(t.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// Checks every tensor of the directory against the file: its element count fits in
/// memory arithmetic, is whole blocks of its type, and its bytes lie inside the file.
fn check_tensors(content: &Content, file_size: u64) -> Result<(), String> {
    for (name, info) in &content.tensor_infos {
        let dims = info.shape.dims();
        let elements = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("tensor `{name}` has an impossible shape {dims:?}"))?;
        let block = info.ggml_dtype.block_size();
        if elements % block != 0 {
            return Err(format!(
                "tensor `{name}` has {elements} elements, not whole blocks of {block} for {:?}",
                info.ggml_dtype
            ));
        }
        let bytes = ((elements / block) as u64).checked_mul(info.ggml_dtype.type_size() as u64);
        let end = bytes.and_then(|bytes| {
            content
                .tensor_data_offset
                .checked_add(info.offset)?
                .checked_add(bytes)
        });
        if end.is_none_or(|end| end > file_size) {
            return Err(format!(
                "tensor `{name}` ({} bytes at offset {}) runs past the end of the file ({file_size} bytes): is the file truncated?",
                bytes.map_or_else(|| "too many".to_string(), |b| b.to_string()),
                info.offset
            ));
        }
    }
    Ok(())
}

/// A candle error's message without the backtrace candle attaches when `RUST_BACKTRACE`
/// is set.
fn candle_message(e: candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(*inner),
        other => other.to_string(),
    }
}

/// ggml's name of a tensor type id.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    NAMES.get(id as usize).copied()
}

/// candle's "unknown dtype for tensor 23" as a sentence naming the weight type and the
/// ones ferrite reads.
fn describe_type_error(message: String) -> String {
    let Some(id) = message
        .strip_prefix("unknown dtype for tensor ")
        .and_then(|n| n.trim().parse::<u32>().ok())
    else {
        return message;
    };
    let name = ggml_type_name(id).unwrap_or("unknown");
    format!(
        "it has tensors of type {name} (ggml type {id}), which ferrite does not read yet \
         (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)"
    )
}

/// The text of a caught panic.
fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the reader failed".into())
}

/// GGUF metadata with typed accessors that name the missing or mistyped key.
#[derive(Debug, Clone)]
pub struct GgufMetadata {
    values: HashMap<String, Value>,
}

impl From<HashMap<String, Value>> for GgufMetadata {
    /// Metadata from key-value pairs (tests build small vocabularies this way).
    fn from(values: HashMap<String, Value>) -> Self {
        Self { values }
    }
}

impl GgufMetadata {
    fn get(&self, key: &str) -> Result<&Value, EngineError> {
        self.values
            .get(key)
            .ok_or_else(|| EngineError::InvalidModel(format!("missing metadata `{key}`")))
    }

    fn typed<T>(&self, key: &str, r: candle_core::Result<T>) -> Result<T, EngineError> {
        r.map_err(|e| EngineError::InvalidModel(format!("metadata `{key}`: {e}")))
    }

    /// A string value.
    pub fn string(&self, key: &str) -> Result<String, EngineError> {
        let v = self.get(key)?;
        self.typed(key, v.to_string().cloned())
    }

    /// An unsigned integer value, whatever its stored width.
    pub fn u32(&self, key: &str) -> Result<u32, EngineError> {
        let v = self.get(key)?;
        let n = match v {
            Value::U8(x) => *x as u64,
            Value::U16(x) => *x as u64,
            Value::U32(x) => *x as u64,
            Value::U64(x) => *x,
            Value::I8(x) => *x as u64,
            Value::I16(x) => *x as u64,
            Value::I32(x) => *x as u64,
            Value::I64(x) => *x as u64,
            _ => {
                return Err(EngineError::InvalidModel(format!(
                    "metadata `{key}` is not an integer"
                )))
            }
        };
        u32::try_from(n)
            .map_err(|_| EngineError::InvalidModel(format!("metadata `{key}` is too large")))
    }

    /// A float value.
    pub fn f32(&self, key: &str) -> Result<f32, EngineError> {
        let v = self.get(key)?;
        match v {
            Value::F64(x) => Ok(*x as f32),
            _ => self.typed(key, v.to_f32()),
        }
    }

    /// A boolean value.
    pub fn bool(&self, key: &str) -> Result<bool, EngineError> {
        let v = self.get(key)?;
        self.typed(key, v.to_bool())
    }

    /// An array of strings.
    pub fn string_array(&self, key: &str) -> Result<Vec<String>, EngineError> {
        let v = self.get(key)?;
        let items = self.typed(key, v.to_vec())?;
        items
            .iter()
            .map(|x| self.typed(key, x.to_string().cloned()))
            .collect()
    }

    /// An array of floats.
    pub fn f32_array(&self, key: &str) -> Result<Vec<f32>, EngineError> {
        let v = self.get(key)?;
        let items = self.typed(key, v.to_vec())?;
        items.iter().map(|x| self.typed(key, x.to_f32())).collect()
    }

    /// An array of signed integers.
    pub fn i32_array(&self, key: &str) -> Result<Vec<i32>, EngineError> {
        let v = self.get(key)?;
        let items = self.typed(key, v.to_vec())?;
        items.iter().map(|x| self.typed(key, x.to_i32())).collect()
    }
}
