//! The metadata of a GGUF file: its [`Value`]s, and [`GgufFile`]'s typed getters that name
//! the file, the key and what it was needed for when one is missing or of another type.

use super::{GgufError, GgufFile, Result};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Any integer type, as `u64` when non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
}

impl GgufFile {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn missing(&self, key: &str, purpose: &str) -> GgufError {
        GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
            purpose: purpose.to_string(),
        }
    }

    fn wrong_type(&self, key: &str, v: &Value, expected: &'static str) -> GgufError {
        GgufError::KeyType {
            path: self.path.clone(),
            key: key.to_string(),
            found: v.type_name(),
            expected,
        }
    }

    pub fn get_str(&self, key: &str, purpose: &str) -> Result<&str> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(self.wrong_type(key, v, "string")),
            None => Err(self.missing(key, purpose)),
        }
    }

    pub fn get_u64(&self, key: &str, purpose: &str) -> Result<u64> {
        match self.get(key) {
            Some(v) => v
                .as_u64()
                .ok_or_else(|| self.wrong_type(key, v, "unsigned integer")),
            None => Err(self.missing(key, purpose)),
        }
    }

    pub fn get_f64(&self, key: &str, purpose: &str) -> Result<f64> {
        match self.get(key) {
            Some(v) => v.as_f64().ok_or_else(|| self.wrong_type(key, v, "number")),
            None => Err(self.missing(key, purpose)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// A string array (tokens, merges).
    pub fn get_str_array(&self, key: &str, purpose: &str) -> Result<Vec<&str>> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.as_str()),
                    other => Err(self.wrong_type(key, other, "array of strings")),
                })
                .collect(),
            Some(v) => Err(self.wrong_type(key, v, "array of strings")),
            None => Err(self.missing(key, purpose)),
        }
    }

    /// A numeric array (scores, token types) as f64.
    pub fn get_num_array(&self, key: &str, purpose: &str) -> Result<Vec<f64>> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_f64()
                        .or(match v {
                            Value::I32(i) => Some(*i as f64),
                            _ => None,
                        })
                        .ok_or_else(|| self.wrong_type(key, v, "array of numbers"))
                })
                .collect(),
            Some(v) => Err(self.wrong_type(key, v, "array of numbers")),
            None => Err(self.missing(key, purpose)),
        }
    }
}
