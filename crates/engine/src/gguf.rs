//! Reading GGUF files: typed metadata access and tensor loading. The header is read by
//! our own reader (`gguf_header.rs`), so that tensors of types candle does not know are
//! listed too; tensors of the types candle reads become candle tensors, IQ4 ones go to our
//! own kernels. A malformed file (truncated, corrupted, hostile) is an
//! [`EngineError::InvalidModel`] naming the file and the problem: the header's sizes are
//! checked against the file before anything is allocated for them, and a panic inside
//! candle while building a tensor is caught.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek, SeekFrom};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;

use crate::gguf_header::{self, Header, TensorInfo};
use crate::quant::formats::{self, MatrixReader};
use crate::quant::{Embedding, PanelMatrix, QMatrix};

use crate::error::EngineError;

/// Panics inside candle caught so far while building tensors, in this process. A malformed
/// file must give an error, and it does either way; but each caught panic is a case that
/// candle does not check and we do not check first: the fuzz targets count one as a
/// finding.
static CAUGHT_PANICS: AtomicU64 = AtomicU64::new(0);

/// How many panics inside candle were caught (turned into errors) so far.
pub fn caught_panics() -> u64 {
    CAUGHT_PANICS.load(Ordering::Relaxed)
}

/// Where tensor data is read from: a file, or bytes in memory.
trait Source: Read + Seek + Send {}

impl<T: Read + Seek + Send> Source for T {}

/// An open GGUF file: its metadata, tensor directory and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    tensors: HashMap<String, TensorInfo>,
    data_offset: u64,
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
        let Header {
            metadata,
            tensors,
            data_offset,
        } = gguf_header::read(&mut reader, size).map_err(bad)?;
        check_tensors(&tensors, data_offset, size).map_err(bad)?;
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
            data_offset,
            reader,
            meta: GgufMetadata { values: metadata },
            rounds_by_kernel: false,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file has a tensor of this name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn info(&self, name: &str) -> Result<TensorInfo, EngineError> {
        self.tensors
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::InvalidModel(format!("missing tensor `{name}`")))
    }

    /// A tensor's ggml type and its bytes as stored (the tests cut matrices from them).
    pub fn raw(&mut self, name: &str) -> Result<(u32, Vec<u8>), EngineError> {
        let info = self.info(name)?;
        Ok((info.ggml_type, self.bytes(name, &info)?))
    }

    /// A tensor's bytes as stored (its size was checked against the file when opened).
    fn bytes(&mut self, name: &str, info: &TensorInfo) -> Result<Vec<u8>, EngineError> {
        let (block_len, block_bytes) = type_geometry(info.ggml_type).expect("checked at open");
        let elements: usize = info.dims.iter().product();
        let mut bytes = vec![0u8; elements / block_len * block_bytes];
        let read = self
            .reader
            .seek(SeekFrom::Start(self.data_offset + info.offset))
            .and_then(|_| self.reader.read_exact(&mut bytes));
        read.map_err(|e| {
            EngineError::InvalidModel(format!("{}: tensor `{name}`: {e}", self.path.display()))
        })?;
        Ok(bytes)
    }

    /// Loads a tensor in its stored (possibly quantized) form, for the types candle reads.
    pub fn qtensor(&mut self, name: &str) -> Result<QTensor, EngineError> {
        let info = self.info(name)?;
        let Some(dtype) = candle_type(info.ggml_type) else {
            return Err(EngineError::InvalidModel(format!(
                "{}: tensor `{name}` is {}, which is read only as a weight matrix or embedding",
                self.path.display(),
                type_name(info.ggml_type)
            )));
        };
        let bytes = self.bytes(name, &info)?;
        let build = catch_unwind(AssertUnwindSafe(|| {
            let storage = QStorage::from_data(std::borrow::Cow::Owned(bytes), &Device::Cpu, dtype)?;
            QTensor::new(storage, info.dims.clone())
        }));
        match build {
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
        let info = self.info(name)?;
        if candle_type(info.ggml_type).is_none() {
            let [rows, cols] = info.dims[..] else {
                return Err(EngineError::InvalidModel(format!(
                    "{}: tensor `{name}` is not a matrix",
                    self.path.display()
                )));
            };
            let bytes = self.bytes(name, &info)?;
            return QMatrix::from_raw(info.ggml_type, &bytes, rows, cols).unwrap_or_else(|| {
                Err(EngineError::Unsupported(format!(
                    "{}: matrix `{name}` is {} with {rows} rows, a shape ferrite has no kernel for",
                    self.path.display(),
                    type_name(info.ggml_type)
                )))
            });
        }
        let m = QMatrix::new(self.qtensor(name)?)?;
        self.rounds_by_kernel |= m.rounds_by_kernel();
        Ok(m)
    }

    /// Loads an F16 weight matrix laid out in panels for products of many rows at once (a
    /// vision tower's), or `None` where the tensor is of another type.
    pub fn panel_matrix(&mut self, name: &str) -> Result<Option<PanelMatrix>, EngineError> {
        let info = self.info(name)?;
        if info.ggml_type != formats::F16.ggml_type {
            return Ok(None);
        }
        let [rows, cols] = info.dims[..] else {
            return Err(EngineError::InvalidModel(format!(
                "{}: tensor `{name}` is not a matrix",
                self.path.display()
            )));
        };
        let bytes = self.bytes(name, &info)?;
        PanelMatrix::new(&bytes, rows, cols).map(Some)
    }

    /// Loads a token embedding (`[vocabulary, width]`).
    pub fn embedding(&mut self, name: &str) -> Result<Embedding, EngineError> {
        let info = self.info(name)?;
        if candle_type(info.ggml_type).is_some() {
            return Ok(Embedding::Candle(self.qtensor(name)?));
        }
        let format = formats::find(info.ggml_type)
            .filter(|f| f.reads_rows())
            .ok_or_else(|| {
                EngineError::InvalidModel(format!(
                    "{}: embedding `{name}` is {}, which ferrite does not read as rows",
                    self.path.display(),
                    type_name(info.ggml_type)
                ))
            })?;
        let width = info.dims.last().copied().unwrap_or(0);
        let data = self.bytes(name, &info)?;
        Ok(Embedding::Rows {
            format,
            data,
            width,
        })
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
        Ok(self.info(name)?.dims)
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

/// Checks every tensor of the directory against the file: its type is one ferrite reads,
/// its element count fits in memory arithmetic and is whole blocks of its type, and its
/// bytes lie inside the file.
fn check_tensors(
    tensors: &HashMap<String, TensorInfo>,
    data_offset: u64,
    file_size: u64,
) -> Result<(), String> {
    for (name, info) in tensors {
        let dims = &info.dims;
        let Some((block, block_bytes)) = type_geometry(info.ggml_type) else {
            let readable: Vec<String> = formats::FORMATS
                .iter()
                .map(|f| f.name.to_string())
                .collect();
            return Err(format!(
                "tensor `{name}` is of type {} (ggml type {}), which ferrite does not read yet \
                 (it reads {})",
                ggml_type_name(info.ggml_type).unwrap_or("unknown"),
                info.ggml_type,
                readable.join(", ")
            ));
        };
        let type_name = type_name(info.ggml_type);
        let elements = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("tensor `{name}` has an impossible shape {dims:?}"))?;
        if elements % block != 0 || dims.last().is_some_and(|w| w % block != 0) {
            return Err(format!(
                "tensor `{name}` of {dims:?} values is not whole blocks of {block} for {type_name}"
            ));
        }
        let bytes = ((elements / block) as u64).checked_mul(block_bytes as u64);
        let end = bytes.and_then(|bytes| data_offset.checked_add(info.offset)?.checked_add(bytes));
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

/// Values per block and bytes per block of a type ferrite reads.
fn type_geometry(id: u32) -> Option<(usize, usize)> {
    formats::find(id).map(|f| (f.block_values, f.block_bytes))
}

/// candle's type for a ggml type id, for the types candle reads.
fn candle_type(id: u32) -> Option<GgmlDType> {
    match formats::find(id)?.matrix {
        MatrixReader::Candle(dtype) => Some(dtype),
        MatrixReader::Raw(_) | MatrixReader::Table => None,
    }
}

/// A type's name for messages.
fn type_name(id: u32) -> String {
    ggml_type_name(id).map_or_else(|| format!("ggml type {id}"), str::to_string)
}

/// A candle error's message without the backtrace candle attaches when `RUST_BACKTRACE`
/// is set.
fn candle_message(e: candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(*inner),
        other => other.to_string(),
    }
}

/// ggml's name of a tensor type id: the registry's for the types ferrite reads.
fn ggml_type_name(id: u32) -> Option<&'static str> {
    if let Some(f) = formats::find(id) {
        return Some(f.name);
    }
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    NAMES.get(id as usize).copied()
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
