//! A minimal GGUF (version 3) writer: metadata key-values, then the tensor directory, then
//! the tensor data, each tensor aligned to 32 bytes as `general.alignment`'s default says.

use std::io::{self, Write};

use candle_core::quantized::gguf_file::Value;

/// Tensor data alignment (GGUF's default; the writer never sets `general.alignment`).
const ALIGNMENT: usize = 32;

/// One tensor to write: its name, dimensions outermost first (`[rows, cols]`, as candle and
/// ferrite name them), ggml type id, and raw bytes.
pub struct TensorData {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// ggml's type id (`GGML_TYPE_*`).
    pub ggml_type: u32,
    /// The tensor's bytes in that type's layout.
    pub bytes: Vec<u8>,
}

/// A GGUF file being assembled in memory.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorData>,
}

impl GgufWriter {
    /// Sets a metadata key: keys are written in the order first set; setting one again
    /// replaces its value in place.
    pub fn meta(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) => *old = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// Adds a tensor.
    pub fn tensor(&mut self, tensor: TensorData) {
        self.tensors.push(tensor);
    }

    /// Writes the whole file.
    pub fn write(&self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(b"GGUF")?;
        out.write_all(&3u32.to_le_bytes())?;
        out.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        out.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        let mut header = Vec::new();
        for (key, value) in &self.metadata {
            write_string(&mut header, key);
            header.extend_from_slice(&value_type(value).to_le_bytes());
            write_value(&mut header, value);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            write_string(&mut header, &t.name);
            header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            // GGUF lists dimensions innermost first.
            for &d in t.dims.iter().rev() {
                header.extend_from_slice(&(d as u64).to_le_bytes());
            }
            header.extend_from_slice(&t.ggml_type.to_le_bytes());
            header.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + t.bytes.len()).next_multiple_of(ALIGNMENT);
        }
        out.write_all(&header)?;
        let written = 24 + header.len();
        out.write_all(&vec![0; written.next_multiple_of(ALIGNMENT) - written])?;
        for t in &self.tensors {
            out.write_all(&t.bytes)?;
            let pad = t.bytes.len().next_multiple_of(ALIGNMENT) - t.bytes.len();
            out.write_all(&vec![0; pad])?;
        }
        Ok(())
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// GGUF's value type id.
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => write_string(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(items) => {
            // An empty array's element type is irrelevant; GGUF still wants one.
            let ty = items.first().map_or(4, value_type);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::Content;

    #[test]
    fn candle_reads_back_what_was_written() {
        let mut w = GgufWriter::default();
        w.meta("general.architecture", Value::String("llama".into()));
        w.meta("a.list", Value::Array(vec![Value::I32(-3), Value::I32(7)]));
        w.meta("a.float", Value::F32(0.5));
        let floats: Vec<u8> = [1.0f32, 2.0, 3.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        w.tensor(TensorData {
            name: "v".into(),
            dims: vec![3],
            ggml_type: 0,
            bytes: floats,
        });
        w.tensor(TensorData {
            name: "m".into(),
            dims: vec![2, 4],
            ggml_type: 0,
            bytes: (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        });
        let mut bytes = Vec::new();
        w.write(&mut bytes).unwrap();
        let mut cursor = std::io::Cursor::new(bytes);
        let content = Content::read(&mut cursor).unwrap();
        assert_eq!(
            content.metadata["general.architecture"]
                .to_string()
                .unwrap(),
            "llama"
        );
        assert_eq!(content.metadata["a.float"].to_f32().unwrap(), 0.5);
        let m = content
            .tensor(&mut cursor, "m", &candle_core::Device::Cpu)
            .unwrap();
        assert_eq!(m.shape().dims(), &[2, 4]);
        let values = m
            .dequantize(&candle_core::Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(values, (0..8).map(|i| i as f32).collect::<Vec<_>>());
    }
}
