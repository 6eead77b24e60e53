//! A response's shape, measured before it is parsed: how many JSON values it holds and how
//! deep they nest.
//!
//! A response is capped in bytes, but bytes do not bound what parsing them costs: 4 MiB of
//! `[0,0,0,…]` is two million values, each a `serde_json::Value` of its own on the host's heap.
//! One pass over the bytes counts them, allocating nothing, so a response past the bounds is
//! refused before `serde_json` sees it and one within them has a known parse cost, drawn from
//! the host's memory budget (see `plugin.rs`).
//!
//! The scan is exact for well-formed JSON and for every prefix of it, which is all the parser
//! reads before it stops at an error: what it allocates is never more than was counted here.

use std::fmt;
use std::mem::size_of;

use serde_json::Value;

/// What one pass over a response found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Strings, numbers, `true`, `false`, `null`, objects and arrays; object keys count too,
    /// as the parser allocates each like a string value.
    pub values: u64,
    /// Arrays among the values.
    pub arrays: u64,
    /// Objects among the values.
    pub objects: u64,
    /// The deepest nesting of objects and arrays (`0` for a lone scalar).
    pub depth: u32,
    /// The byte offset where the nesting first went past the depth bound, if it did.
    pub too_deep_at: Option<usize>,
}

/// Heap bytes the parse may take per value, over and above the response's own bytes (which
/// bound every string's contents): the value's slot, doubled because a `Vec` grows by
/// doubling, and the smallest heap block glibc hands out (32 bytes), which a string or a key
/// takes however short it is.
const BYTES_PER_VALUE: u64 = 2 * size_of::<Value>() as u64 + 32;

/// Heap bytes an array's first block takes: a `Vec` starts at 4 slots, so `[[0],[0],…]` costs
/// that much per element.
const BYTES_PER_ARRAY: u64 = 4 * size_of::<Value>() as u64 + 16;

/// Heap bytes an object's first node takes: a B-tree leaf of 11 keys and values, so
/// `[{"a":0},…]` costs that much per element. (Measured, glibc, 200,000 values per shape: a
/// leaf per one-key object, 714 bytes for its three values; 61 bytes per value of `[0,0,…]`;
/// 186 bytes per `[0]`. This estimate is above each.)
const BYTES_PER_OBJECT: u64 = 11 * (size_of::<String>() + size_of::<Value>()) as u64 + 32;

impl Shape {
    /// Counts the values of `bytes` and their nesting; `max_depth` only marks where the
    /// nesting first went past it. One linear pass; strings are skipped whole, escapes
    /// included, so a `[`, `{` or `"` inside one counts for nothing.
    pub(crate) fn of(bytes: &[u8], max_depth: u32) -> Self {
        let mut shape = Shape {
            values: 0,
            arrays: 0,
            objects: 0,
            depth: 0,
            too_deep_at: None,
        };
        let mut depth: u32 = 0;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    shape.values += 1;
                    i += 1;
                    while i < bytes.len() {
                        match bytes[i] {
                            // The escaped byte is part of the string, whatever it is.
                            b'\\' => i += 2,
                            b'"' => break,
                            _ => i += 1,
                        }
                    }
                    // Past the closing quote (or the end of an unterminated string).
                    i += 1;
                }
                open @ (b'{' | b'[') => {
                    shape.values += 1;
                    if open == b'[' {
                        shape.arrays += 1;
                    } else {
                        shape.objects += 1;
                    }
                    depth += 1;
                    if depth > max_depth && shape.too_deep_at.is_none() {
                        shape.too_deep_at = Some(i);
                    }
                    shape.depth = shape.depth.max(depth);
                    i += 1;
                }
                // A stray closer is malformed; the parser stops there anyway.
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    i += 1;
                }
                // A number or a literal: one value, however long its run of characters.
                b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                    shape.values += 1;
                    i += 1;
                    while i < bytes.len()
                        && (bytes[i].is_ascii_alphanumeric()
                            || matches!(bytes[i], b'+' | b'-' | b'.'))
                    {
                        i += 1;
                    }
                }
                // Whitespace, `,` and `:`; anything else is malformed and left to the parser.
                _ => i += 1,
            }
        }
        shape
    }

    /// The shape of two texts parsed side by side: their values add up, the deeper counts.
    pub(crate) fn plus(self, other: Shape) -> Shape {
        Shape {
            values: self.values + other.values,
            arrays: self.arrays + other.arrays,
            objects: self.objects + other.objects,
            depth: self.depth.max(other.depth),
            too_deep_at: self.too_deep_at.or(other.too_deep_at),
        }
    }

    /// Checks the shape against the bounds; the error says what was counted and the bound.
    pub(crate) fn check(&self, max_values: u64, max_depth: u32) -> Result<(), Excess> {
        if let Some(at) = self.too_deep_at {
            return Err(Excess::Depth {
                depth: self.depth,
                at,
                limit: max_depth,
            });
        }
        if self.values > max_values {
            return Err(Excess::Values {
                values: self.values,
                limit: max_values,
            });
        }
        Ok(())
    }

    /// What parsing a response of this shape and `len` bytes may allocate on the host's heap,
    /// in bytes: every value, every array's and object's first block, and the bytes again for
    /// the strings' contents.
    pub(crate) fn parse_cost(&self, len: usize) -> u64 {
        self.values
            .saturating_mul(BYTES_PER_VALUE)
            .saturating_add(self.arrays.saturating_mul(BYTES_PER_ARRAY))
            .saturating_add(self.objects.saturating_mul(BYTES_PER_OBJECT))
            .saturating_add(len as u64)
    }
}

/// A bound a response went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Excess {
    /// More values than the bound.
    Values {
        /// Values counted.
        values: u64,
        /// The bound.
        limit: u64,
    },
    /// Nested deeper than the bound.
    Depth {
        /// The deepest nesting counted.
        depth: u32,
        /// The byte offset where it first went past the bound.
        at: usize,
        /// The bound.
        limit: u32,
    },
}

impl fmt::Display for Excess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Values { values, limit } => write!(
                f,
                "{values} JSON values (object keys included); the host parses at most {limit} per response, so it was not parsed"
            ),
            Self::Depth { depth, at, limit } => write!(
                f,
                "nested {depth} deep (past {limit} at byte {at}); the host parses at most {limit} levels, so it was not parsed"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(json: &str) -> Shape {
        Shape::of(json.as_bytes(), 64)
    }

    /// The scan agrees with the parser on well-formed JSON: every value, and every key.
    fn parsed_values(json: &str) -> u64 {
        fn count(v: &Value) -> u64 {
            1 + match v {
                Value::Array(items) => items.iter().map(count).sum(),
                Value::Object(map) => map.values().map(|v| 1 + count(v)).sum(),
                _ => 0,
            }
        }
        count(&serde_json::from_str(json).unwrap())
    }

    #[test]
    fn counts_values_keys_and_depth() {
        for (json, values, depth) in [
            ("0", 1, 0),
            ("  -12.5e+3 ", 1, 0),
            ("[]", 1, 1),
            ("[0,0,0]", 4, 1),
            ("[true,false,null]", 4, 1),
            (r#"{"a":1,"b":[2,{"c":null}]}"#, 9, 3),
            (
                r#"{"children":[{"metadata":{"name":"x"}}],"finalized":false}"#,
                10,
                4,
            ),
        ] {
            assert_eq!(shape(json).values, values, "{json}");
            assert_eq!(parsed_values(json), values, "{json}");
            assert_eq!(shape(json).depth, depth, "{json}");
        }
    }

    #[test]
    fn string_contents_count_for_nothing() {
        for json in [
            r#"["[[[{{{"]"#,
            r#"["a \"quoted\" [ word {"]"#,
            r#"["ends in a backslash \\"]"#,
            r#"["\\\"[", "\\\\"]"#,
            r#"{"k\"[": "v\\", "x": "\u005b"}"#,
        ] {
            assert_eq!(shape(json).values, parsed_values(json), "{json}");
            assert_eq!(shape(json).depth, 1, "{json}");
        }
        // A backslash before the closing quote ends the string only when it is escaped itself.
        assert_eq!(shape(r#"["\\", [0]]"#).depth, 2);
        assert_eq!(shape(r#"["\", [0]]"#).depth, 1, "the quote was escaped");
    }

    #[test]
    fn depth_at_the_bound_passes_and_one_more_is_refused() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let at = Shape::of(nested(64).as_bytes(), 64);
        assert_eq!(at.depth, 64);
        assert_eq!(at.check(u64::MAX, 64), Ok(()));
        let over = Shape::of(nested(65).as_bytes(), 64);
        assert_eq!(
            over.check(u64::MAX, 64),
            Err(Excess::Depth {
                depth: 65,
                at: 64,
                limit: 64
            })
        );
        // Objects nest too, and depth is the deepest point, not the sum.
        let objects = format!("{}0{}", r#"{"a":"#.repeat(3), "}".repeat(3));
        assert_eq!(shape(&objects).depth, 3);
        assert_eq!(shape("[[0],[[0]],[0]]").depth, 3);
        let error = Shape::of(nested(70).as_bytes(), 64)
            .check(u64::MAX, 64)
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "nested 70 deep (past 64 at byte 64); the host parses at most 64 levels, so it was not parsed"
        );
    }

    #[test]
    fn values_at_the_bound_pass_and_one_more_is_refused() {
        let zeros = |n: usize| format!("[{}]", vec!["0"; n].join(","));
        // The array itself is a value: 9 zeros and the array are 10.
        assert_eq!(shape(&zeros(9)).check(10, 64), Ok(()));
        assert_eq!(
            shape(&zeros(10)).check(10, 64),
            Err(Excess::Values {
                values: 11,
                limit: 10
            })
        );
        let million = zeros(1_000_000);
        assert!(million.len() < 4 << 20, "within the default byte cap");
        let error = shape(&million).check(250_000, 64).unwrap_err();
        assert_eq!(
            error.to_string(),
            "1000001 JSON values (object keys included); the host parses at most 250000 per response, so it was not parsed"
        );
    }

    #[test]
    fn malformed_input_is_scanned_without_panicking() {
        for json in [
            "\"unterminated",
            "\"\\",
            "]]]}}",
            "[1 2 3",
            "{\"a\" \"b\"}",
            "",
        ] {
            assert!(shape(json).depth <= 1, "{json}");
        }
        assert_eq!(shape("]]][").depth, 1, "stray closers do not go below zero");
    }

    #[test]
    fn the_parse_cost_covers_every_value_and_the_bytes() {
        let s = shape(r#"[0,{"a":[]}]"#);
        assert_eq!((s.values, s.arrays, s.objects), (5, 2, 1));
        assert_eq!(
            s.parse_cost(12),
            5 * BYTES_PER_VALUE + 2 * BYTES_PER_ARRAY + BYTES_PER_OBJECT + 12
        );
    }
}
