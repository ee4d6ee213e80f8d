//! Reading a GGUF file's header: its metadata and its tensor directory. Our own reader,
//! so that a tensor of a type candle does not know (IQ4_XS, say) is still listed, with its
//! ggml type id, and the loader decides what to do with it. Every length and count is
//! checked against the bytes left in the file before anything is allocated for it.

use std::collections::HashMap;
use std::io::{Read, Seek};

use candle_core::quantized::gguf_file::Value;

/// Default alignment of the tensor data (when `general.alignment` is absent).
const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have.
const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays in metadata.
const MAX_ARRAY_DEPTH: usize = 2;

/// One tensor of the directory.
#[derive(Debug, Clone)]
pub(crate) struct TensorInfo {
    /// Dimensions, outermost first (`[rows, cols]` for a matrix).
    pub dims: Vec<usize>,
    /// ggml's type id.
    pub ggml_type: u32,
    /// Offset of the data from the start of the tensor data section.
    pub offset: u64,
}

/// A parsed header.
pub(crate) struct Header {
    /// Metadata key-values.
    pub metadata: HashMap<String, Value>,
    /// The tensor directory.
    pub tensors: HashMap<String, TensorInfo>,
    /// Where the tensor data section starts in the file.
    pub data_offset: u64,
}

/// A reader that knows how many bytes the file has left.
struct Cursor<'a, R> {
    reader: &'a mut R,
    position: u64,
    size: u64,
    /// GGUF version 1 writes lengths and counts as u32.
    narrow: bool,
}

impl<R: Read + Seek> Cursor<'_, R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], String> {
        self.need(N as u64, "a value")?;
        let mut buf = [0u8; N];
        self.reader
            .read_exact(&mut buf)
            .map_err(|e| format!("reading the header: {e}"))?;
        self.position += N as u64;
        Ok(buf)
    }

    fn need(&self, n: u64, what: &str) -> Result<(), String> {
        let left = self.size.saturating_sub(self.position);
        if n > left {
            return Err(format!(
                "{what} of {n} bytes at offset {} runs past the end of the file ({} bytes)",
                self.position, self.size
            ));
        }
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// A length or count (u32 in version 1, u64 after).
    fn length(&mut self) -> Result<u64, String> {
        if self.narrow {
            Ok(self.u32()? as u64)
        } else {
            self.u64()
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.length()?;
        self.need(len, "a string")?;
        let mut buf = vec![0u8; len as usize];
        self.reader
            .read_exact(&mut buf)
            .map_err(|e| format!("reading the header: {e}"))?;
        self.position += len;
        // Some writers end strings with NULs; some write invalid UTF-8 (as candle reads it).
        while buf.last() == Some(&0) {
            buf.pop();
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    fn value(&mut self, value_type: u32, depth: usize) -> Result<Value, String> {
        Ok(match value_type {
            0 => Value::U8(self.bytes::<1>()?[0]),
            1 => Value::I8(self.bytes::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth < MAX_ARRAY_DEPTH => {
                let element_type = self.u32()?;
                let count = self.length()?;
                // Every element takes at least one byte: a count the file cannot hold is
                // refused before anything is allocated for it.
                self.need(count, "an array")?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(element_type, depth + 1)?);
                }
                Value::Array(items)
            }
            9 => return Err("arrays nested too deep".into()),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}

/// Reads the header of a GGUF file of `size` bytes from its start.
pub(crate) fn read<R: Read + Seek>(reader: &mut R, size: u64) -> Result<Header, String> {
    let mut c = Cursor {
        reader,
        position: 0,
        size,
        narrow: false,
    };
    let magic = c.bytes::<4>()?;
    if &magic != b"GGUF" {
        return Err("it does not start with the GGUF magic".into());
    }
    match c.u32()? {
        1 => c.narrow = true,
        2 | 3 => {}
        v => return Err(format!("GGUF version {v} is not supported (1 to 3 are)")),
    }
    let tensor_count = c.length()?;
    let kv_count = c.length()?;
    // A key-value takes at least 13 bytes, a directory entry 24: counts the file cannot
    // hold are refused before anything is sized by them.
    c.need(
        kv_count
            .saturating_mul(13)
            .saturating_add(tensor_count.saturating_mul(24)),
        &format!("a header of {kv_count} key-values and {tensor_count} tensors"),
    )?;
    let mut metadata = HashMap::with_capacity(kv_count as usize);
    for _ in 0..kv_count {
        let key = c.string()?;
        let value_type = c.u32()?;
        let value = c
            .value(value_type, 0)
            .map_err(|e| format!("metadata `{key}`: {e}"))?;
        metadata.insert(key, value);
    }
    let mut tensors = HashMap::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        let name = c.string()?;
        let n_dims = c.u32()?;
        if n_dims > MAX_DIMS {
            return Err(format!("tensor `{name}` has {n_dims} dimensions"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = c.length()?;
            dims.push(usize::try_from(d).map_err(|_| format!("tensor `{name}` is too large"))?);
        }
        // GGUF lists dimensions innermost first.
        dims.reverse();
        let ggml_type = c.u32()?;
        let offset = c.u64()?;
        tensors.insert(
            name,
            TensorInfo {
                dims,
                ggml_type,
                offset,
            },
        );
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U8(v)) => *v as u64,
        Some(Value::U16(v)) => *v as u64,
        Some(Value::U32(v)) => *v as u64,
        Some(Value::U64(v)) => *v,
        Some(Value::I32(v)) if *v > 0 => *v as u64,
        Some(_) => return Err("`general.alignment` is not a positive integer".into()),
    };
    if alignment == 0 || alignment > 1 << 20 {
        return Err(format!("`general.alignment` is {alignment}"));
    }
    let data_offset = c.position.div_ceil(alignment) * alignment;
    Ok(Header {
        metadata,
        tensors,
        data_offset,
    })
}
