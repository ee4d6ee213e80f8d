//! Reading GGUF files: typed metadata access and tensor loading on top of candle's reader.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;

use crate::quant::QMatrix;
use candle_core::Device;

use crate::EngineError;

/// An open GGUF file: its metadata, tensor directory and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
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
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| {
            EngineError::InvalidModel(format!("{} is not a GGUF file: {e}", path.display()))
        })?;
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
        Ok(self.content.tensor(&mut self.reader, name, &Device::Cpu)?)
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

    /// Loads a small tensor (a norm weight, say) as plain `f32` values.
    pub fn vector(&mut self, name: &str) -> Result<Vec<f32>, EngineError> {
        let t = self.qtensor(name)?.dequantize(&Device::Cpu)?;
        Ok(t.flatten_all()?.to_vec1::<f32>()?)
    }
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
