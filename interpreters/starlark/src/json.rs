//! The request, from JSON text straight onto a call's heap: no `serde_json::Value` tree in
//! between, which at 100 pods cost about as much as the parse itself. serde_json's own depth
//! limit (128) bounds the nesting.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use starlark::values::dict::AllocDict;
use starlark::values::list::AllocList;
use starlark::values::{Heap, Value};

/// `json` decoded into values on `heap`.
pub(crate) fn decode<'v>(heap: Heap<'v>, json: &str) -> Result<Value<'v>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(json);
    let value = Onto(heap).deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Decodes one JSON value onto its heap.
#[derive(Clone, Copy)]
struct Onto<'v>(Heap<'v>);

impl<'de, 'v> DeserializeSeed<'de> for Onto<'v> {
    type Value = Value<'v>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value<'v>, D::Error> {
        d.deserialize_any(self)
    }
}

/// Decodes an object's key, a string escaped or not.
struct Key<'v>(Onto<'v>);

impl<'de, 'v> DeserializeSeed<'de> for Key<'v> {
    type Value = Value<'v>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value<'v>, D::Error> {
        d.deserialize_str(self.0)
    }
}

impl<'de, 'v> Visitor<'de> for Onto<'v> {
    type Value = Value<'v>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value<'v>, E> {
        Ok(Value::new_none())
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value<'v>, E> {
        Ok(Value::new_bool(b))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value<'v>, E> {
        Ok(self.0.alloc(n))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value<'v>, E> {
        Ok(self.0.alloc(n))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value<'v>, E> {
        Ok(self.0.alloc(n))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value<'v>, E> {
        Ok(self.0.alloc_str(s).to_value())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value<'v>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(self.0.alloc(AllocList(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value<'v>, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key_seed(Key(self))? {
            entries.push((key, map.next_value_seed(self)?));
        }
        Ok(self.0.alloc(AllocDict(entries)))
    }
}
