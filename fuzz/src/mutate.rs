//! Structured mutations of seed files, driven by a seeded RNG: byte-level (flip, set, insert,
//! delete, duplicate, overwrite with an extreme integer, truncate, splice with another seed) and,
//! for text formats, token-level (a JSON / TOML number, string or value swapped for an extreme
//! one, a token or a line copied from another seed, a line duplicated or dropped).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Numbers at the edges: integer widths, float range and precision, signs, and the spellings
/// TOML accepts beyond JSON.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9007199254740993",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "100000000000000000000000000000000",
    "1e3",
    "1e6",
    "1e9",
    "1e12",
    "1e18",
    "1e19",
    "1e308",
    "-1e308",
    "1e309",
    "1e-308",
    "5e-324",
    "1e-400",
    "0.0",
    "0.1",
    "0.5",
    "0.9999999999999999",
    "1.0000000000000002",
    "-0.5",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "1.5",
];

/// Strings that readers mishandle: empty, escapes, lone surrogates, control bytes, paths that
/// climb out, names of bundle files, very long.
const STRINGS: &[&str] = &[
    "\"\"",
    "\"a\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\\udfff\\ud800\"",
    "\"\\n\"",
    "\"\\\"\"",
    "\"\u{feff}\"",
    "\"\u{202e}x\"",
    "\"é\"",
    "\"..\"",
    "\"../manifest.json\"",
    "\"/etc/hostname\"",
    "\"a/b\"",
    "\"a\\\\b\"",
    "\".\"",
    "\"model.onnx\"",
    "\"manifest.json\"",
    "\"decision.json\"",
    "\"NaN\"",
    "\"-1\"",
    "\"F32\"",
    "\"BF16\"",
    "\"I64\"",
    "\"qwen3\"",
    "\"decision-bundle/1\"",
    "\"decision-config/1\"",
    "\"decision-thresholds/1\"",
];

/// Values of every JSON type, some nested past serde_json's recursion limit.
const VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "[]",
    "{}",
    "[null]",
    "[0]",
    "[1,2,3]",
    "[[]]",
    "{\"\":null}",
    "{\"a\":1,\"a\":2}",
    "\"x\"",
    "0",
    "-1",
];

/// Integers written as raw little-endian bytes into binary formats (lengths, offsets, counts).
const INTEGERS: &[u64] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0x8000,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// Single bytes with a meaning in the formats fuzzed.
const BYTES: &[u8] = b"\0\xff\x7f\x80\"{}[],:\\\n\r 0-.e#='\xef\xbb\xbf";

/// How the inputs of a target are structured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// JSON or JSON Lines (token and line mutations apply).
    Json,
    /// TOML (token and line mutations apply; the number list includes TOML's inf and nan).
    Toml,
    /// A binary format; token mutations apply to the first `text_prefix` bytes only (the
    /// safetensors JSON header), none when 0.
    Binary { text_prefix: usize },
}

impl Kind {
    fn text_len(self, len: usize) -> usize {
        match self {
            Kind::Json | Kind::Toml => len,
            Kind::Binary { text_prefix } => text_prefix.min(len),
        }
    }
}

/// One input from the seeds: a seed with 1 to 4 stacked mutations (several per input
/// reach states a single one does not), capped at `max_len` bytes.
pub fn mutate(rng: &mut ChaCha8Rng, seeds: &[Vec<u8>], kind: Kind, max_len: usize) -> Vec<u8> {
    let mut data = seeds[rng.random_range(0..seeds.len())].clone();
    let n = 1 + rng.random_range(0..4);
    for _ in 0..n {
        mutate_once(rng, &mut data, seeds, kind);
        data.truncate(max_len);
    }
    data
}

/// A position in `0..=len`, biased to the first and last 4 KiB, where headers and footers live.
fn pos(rng: &mut ChaCha8Rng, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    match rng.random_range(0..10) {
        0..4 => rng.random_range(0..=len),
        4..7 => rng.random_range(0..=len.min(4096)),
        _ => len - rng.random_range(0..=len.min(4096)),
    }
}

fn mutate_once(rng: &mut ChaCha8Rng, data: &mut Vec<u8>, seeds: &[Vec<u8>], kind: Kind) {
    let textual = kind.text_len(data.len()) > 0;
    let op = if textual {
        rng.random_range(0..17)
    } else {
        rng.random_range(0..10)
    };
    let len = data.len();
    match op {
        // A bit flipped.
        0 if len > 0 => {
            let p = pos(rng, len - 1);
            data[p] ^= 1 << rng.random_range(0..8);
        }
        // A byte set to one with a meaning.
        1 if len > 0 => {
            let p = pos(rng, len - 1);
            data[p] = BYTES[rng.random_range(0..BYTES.len())];
        }
        // Random bytes inserted.
        2 => {
            let p = pos(rng, len);
            let k = rng.random_range(1..=16);
            let bytes: Vec<u8> = (0..k).map(|_| rng.random::<u8>()).collect();
            data.splice(p..p, bytes);
        }
        // A range deleted.
        3 if len > 0 => {
            let p = pos(rng, len - 1);
            let k = rng.random_range(1..=64.min(len - p));
            data.drain(p..p + k);
        }
        // A range duplicated, up to 16 times, somewhere else.
        4 if len > 0 => {
            let a = pos(rng, len - 1);
            let k = rng.random_range(1..=256.min(len - a));
            let copy = data[a..a + k].repeat(1 + rng.random_range(0..16));
            let p = pos(rng, len);
            data.splice(p..p, copy);
        }
        // Truncated.
        5 => {
            let p = pos(rng, len);
            data.truncate(p);
        }
        // Spliced: this seed's head, another seed's tail.
        6 => {
            let other = &seeds[rng.random_range(0..seeds.len())];
            let a = pos(rng, len);
            let b = pos(rng, other.len());
            data.truncate(a);
            data.extend_from_slice(&other[b..]);
        }
        // An extreme integer written over the bytes, little-endian, 1 to 8 bytes wide.
        7 if len > 0 => {
            let v = INTEGERS[rng.random_range(0..INTEGERS.len())];
            let w = [1usize, 2, 4, 8][rng.random_range(0..4)].min(len);
            let p = pos(rng, len - w);
            data[p..p + w].copy_from_slice(&v.to_le_bytes()[..w]);
        }
        // A random byte range overwritten with random bytes.
        8 if len > 0 => {
            let p = pos(rng, len - 1);
            let k = rng.random_range(1..=8.min(len - p));
            for b in &mut data[p..p + k] {
                *b = rng.random();
            }
        }
        // A byte replaced by an extreme integer as a LEB128 varint, zigzag or not (how Thrift's
        // compact protocol, hence a Parquet footer, writes its integers: counts, offsets,
        // lengths).
        9 | 16 if len > 0 => {
            let v = INTEGERS[rng.random_range(0..INTEGERS.len())];
            let v = if rng.random() { v << 1 } else { v };
            let p = pos(rng, len - 1);
            data.splice(p..p + 1, varint(v));
        }
        // Token swaps (text formats, or the text head of a binary one).
        10..=13 => {
            let text_len = kind.text_len(len);
            let tokens = tokens(&data[..text_len]);
            if tokens.is_empty() {
                return;
            }
            let t = tokens[rng.random_range(0..tokens.len())];
            let replacement: Vec<u8> = match op {
                10 => {
                    let mut n = NUMBERS[rng.random_range(0..NUMBERS.len())];
                    if kind != Kind::Toml && matches!(n, "nan" | "inf" | "-inf") {
                        n = "NaN";
                    }
                    n.as_bytes().to_vec()
                }
                11 => {
                    if rng.random_range(0..8) == 0 {
                        // A long string (bounded: an input stays small).
                        let k = rng.random_range(1..=8192);
                        let mut s = vec![b'"'];
                        s.extend(std::iter::repeat_n(b'A', k));
                        s.push(b'"');
                        s
                    } else {
                        STRINGS[rng.random_range(0..STRINGS.len())]
                            .as_bytes()
                            .to_vec()
                    }
                }
                12 => {
                    if rng.random_range(0..8) == 0 {
                        // Nested deeper than serde_json's limit of 128.
                        let d = rng.random_range(100..300);
                        let mut s = "[".repeat(d);
                        s.push_str(&"]".repeat(d));
                        s.into_bytes()
                    } else {
                        VALUES[rng.random_range(0..VALUES.len())]
                            .as_bytes()
                            .to_vec()
                    }
                }
                // A token of another seed (or this one).
                _ => {
                    let other = &seeds[rng.random_range(0..seeds.len())];
                    let other_tokens = tokens_of(other, kind);
                    if other_tokens.is_empty() {
                        return;
                    }
                    let (a, b) = other_tokens[rng.random_range(0..other_tokens.len())];
                    other[a..b].to_vec()
                }
            };
            data.splice(t.0..t.1, replacement);
        }
        // Line-level: a line duplicated, dropped, or one of another seed inserted.
        14 | 15 => {
            let text_len = kind.text_len(len);
            let lines = lines(&data[..text_len]);
            if lines.is_empty() {
                return;
            }
            let (a, b) = lines[rng.random_range(0..lines.len())];
            match rng.random_range(0..3) {
                0 => {
                    let copy = data[a..b].to_vec();
                    data.splice(a..a, copy);
                }
                1 => {
                    data.drain(a..b);
                }
                _ => {
                    let other = &seeds[rng.random_range(0..seeds.len())];
                    let other_lines = lines_of(other, kind);
                    if other_lines.is_empty() {
                        return;
                    }
                    let (c, d) = other_lines[rng.random_range(0..other_lines.len())];
                    data.splice(a..a, other[c..d].iter().copied());
                }
            }
        }
        _ => {}
    }
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

fn tokens_of(data: &[u8], kind: Kind) -> Vec<(usize, usize)> {
    tokens(&data[..kind.text_len(data.len())])
}

fn lines_of(data: &[u8], kind: Kind) -> Vec<(usize, usize)> {
    lines(&data[..kind.text_len(data.len())])
}

/// Lines with their `\n`.
fn lines(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &b) in data.iter().enumerate() {
        if b == b'\n' {
            out.push((start, i + 1));
            start = i + 1;
        }
    }
    if start < data.len() {
        out.push((start, data.len()));
    }
    out
}

/// The scalar tokens of JSON or TOML text: strings (either quote), numbers, bare words.
fn tokens(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let b = data[i];
        if b == b'"' || b == b'\'' {
            let start = i;
            i += 1;
            while i < data.len() && data[i] != b && data[i] != b'\n' {
                if data[i] == b'\\' && b == b'"' {
                    i += 1;
                }
                i += 1;
            }
            i = (i + 1).min(data.len());
            out.push((start, i));
        } else if b == b'-' || b.is_ascii_alphanumeric() {
            let start = i;
            while i < data.len()
                && (data[i].is_ascii_alphanumeric() || matches!(data[i], b'-' | b'+' | b'.' | b'_'))
            {
                i += 1;
            }
            out.push((start, i));
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn tokens_split_json_and_toml() {
        let t = tokens(br#"{"a": -1.5e3, "b\"c": [true, null]} x = 'y'"#);
        let text = br#"{"a": -1.5e3, "b\"c": [true, null]} x = 'y'"#;
        let words: Vec<&[u8]> = t.iter().map(|&(a, b)| &text[a..b]).collect();
        assert_eq!(
            words,
            [
                &b"\"a\""[..],
                b"-1.5e3",
                b"\"b\\\"c\"",
                b"true",
                b"null",
                b"x",
                b"'y'"
            ]
        );
    }

    #[test]
    fn same_seed_same_inputs_and_every_input_is_bounded() {
        let seeds = vec![br#"{"a": 1, "b": "x"}"#.to_vec(), b"[1,2]\n[3]\n".to_vec()];
        let run = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..2000)
                .map(|_| mutate(&mut rng, &seeds, Kind::Json, 4096))
                .collect::<Vec<_>>()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        assert!(a.iter().all(|x| x.len() <= 4096));
        // Mutations change inputs, mostly.
        let changed = a.iter().filter(|x| !seeds.contains(x)).count();
        assert!(changed > 1500, "{changed} of 2000 changed");
    }
}
