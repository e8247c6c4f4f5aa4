//! vLLM's KV-cache event messages, as its ZMQ publisher sends them (`--kv-events-config`), one
//! type per message, decoded and encoded by the same code (the tests round-trip both forms and
//! decode messages recorded from a real vLLM 0.32).
//!
//! A message is three frames: the topic, the sequence number (8 bytes, big-endian) and a
//! MessagePack payload `[ts, [event…], data_parallel_rank]`. vLLM 0.32 encodes each event as a
//! map tagged `"type"`; older vLLM releases and SGLang (whose events are a copy of vLLM's)
//! encode it as an array whose first element is the tag, fields in declaration order. Both are
//! read; SGLang appends a `{cache_salt}` map to a salted chain's event, where vLLM's array
//! has `lora_name`: a map there is read as SGLang's. Block hashes are integers, or bytes (vLLM's sha256 hashes when
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` is off): either is a [`PodBlockId`].
//!
//! Decoding is by value (`rmpv`), not by derived types: the two encodings differ in shape, and
//! new fields appear with every release; unknown fields and unknown event types are skipped.

use rmpv::Value;
use thiserror::Error;

/// A message frame larger than this is refused before decoding (a batch holds a scheduler
/// step's events: a few blocks' tokens each; 64 MiB is thousands of full 2k-token prompts).
pub const MAX_PAYLOAD: usize = 64 << 20;

/// The id a pod gives a block: its own hash, as an integer or (sha256) bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodBlockId(pub u64);

impl PodBlockId {
    /// Byte hashes are folded to 64 bits (XXH3): ids only need to be told apart within one
    /// pod's cache.
    pub fn from_bytes(b: &[u8]) -> Self {
        PodBlockId(xxhash_rust::xxh3::xxh3_64(b))
    }
}

/// One entry of a block's `extra_keys`: what besides its tokens went into the pod's hash.
#[derive(Debug, Clone, PartialEq)]
pub enum ExtraKey {
    /// A string: the LoRA adapter's name (first, when the event names one) or the request's
    /// `cache_salt` (on a chain's first block).
    Text(String),
    /// Anything else (multimodal `(identifier, offset)` pairs, prompt-embedding digests): the
    /// block's tokens alone do not say what it holds.
    Other,
}

/// `BlockStored`: blocks computed and now held, a chain continuing `parent`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    pub block_hashes: Vec<PodBlockId>,
    /// The block the first of these continues; `None` for a chain's first block.
    pub parent: Option<PodBlockId>,
    /// Every block's tokens, in order (`block_size` each).
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    /// vLLM's older numeric adapter id (superseded by `lora_name`).
    pub lora_id: Option<i64>,
    pub lora_name: Option<String>,
    /// `GPU` (the pod's own cache), `CPU` or `STORAGE` (offload tiers), or unset.
    pub medium: Option<String>,
    /// Per block, when present.
    pub extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
    /// KV-cache group (hybrid models have several); unset means the only one.
    pub group_idx: Option<i64>,
    /// SGLang's `metadata.cache_salt` (its salted chains; vLLM puts the salt in `extra_keys`).
    pub cache_salt: Option<String>,
}

/// One event of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum PodEvent {
    BlockStored(BlockStored),
    BlockRemoved {
        block_hashes: Vec<PodBlockId>,
        medium: Option<String>,
        group_idx: Option<i64>,
    },
    AllBlocksCleared,
    /// An event type this reader does not know (skipped, counted).
    Unknown(String),
}

/// One message: a batch of events with its sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub topic: Vec<u8>,
    pub seq: u64,
    pub ts: f64,
    pub events: Vec<PodEvent>,
    pub data_parallel_rank: Option<i64>,
}

/// The two encodings of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// vLLM ≥ 0.11: a map with a `"type"` tag.
    Map,
    /// Older vLLM, SGLang: `[tag, field…]`.
    Array,
}

#[derive(Debug, Error, PartialEq)]
pub enum WireError {
    #[error("a message has 3 frames (topic, sequence, payload), this one {0}")]
    Frames(usize),
    #[error("the sequence frame is 8 bytes, this one {0}")]
    Sequence(usize),
    #[error("payload of {0} bytes is over the {MAX_PAYLOAD}-byte limit")]
    TooLarge(usize),
    #[error("payload is not MessagePack: {0}")]
    Decode(String),
    #[error("payload: {0}")]
    Shape(&'static str),
}

/// Decodes one message from its frames.
pub fn decode(frames: &[&[u8]]) -> Result<Message, WireError> {
    let [topic, seq, payload] = frames else {
        return Err(WireError::Frames(frames.len()));
    };
    let seq: [u8; 8] = (*seq)
        .try_into()
        .map_err(|_| WireError::Sequence(seq.len()))?;
    if payload.len() > MAX_PAYLOAD {
        return Err(WireError::TooLarge(payload.len()));
    }
    let value = rmpv::decode::read_value_with_max_depth(&mut &payload[..], 16)
        .map_err(|e| WireError::Decode(e.to_string()))?;
    let Value::Array(parts) = value else {
        return Err(WireError::Shape("a batch is an array [ts, events, rank]"));
    };
    let ts = parts.first().and_then(Value::as_f64).unwrap_or(0.0);
    let events = match parts.get(1) {
        Some(Value::Array(events)) => events.iter().map(event).collect(),
        _ => return Err(WireError::Shape("a batch's second element is its events")),
    };
    Ok(Message {
        topic: topic.to_vec(),
        seq: u64::from_be_bytes(seq),
        ts,
        events,
        data_parallel_rank: parts.get(2).and_then(Value::as_i64),
    })
}

/// Encodes a message as a publisher would (the tests' publisher; `Form::Array` as SGLang).
pub fn encode(message: &Message, form: Form) -> [Vec<u8>; 3] {
    let mut batch = vec![
        Value::from(message.ts),
        Value::Array(message.events.iter().map(|e| to_value(e, form)).collect()),
    ];
    if let Some(rank) = message.data_parallel_rank {
        batch.push(Value::from(rank));
    }
    let mut payload = Vec::new();
    // writing into a Vec cannot fail
    let _ = rmpv::encode::write_value(&mut payload, &Value::Array(batch));
    [
        message.topic.clone(),
        message.seq.to_be_bytes().to_vec(),
        payload,
    ]
}

/// Field order of the array form (vLLM's struct declaration order, which msgspec follows).
const STORED_FIELDS: [&str; 10] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "metadata",
];
const REMOVED_FIELDS: [&str; 3] = ["block_hashes", "medium", "group_idx"];

/// An event's fields, in either form.
enum Fields<'a> {
    Map(&'a [(Value, Value)]),
    /// the items after the tag, and their names in order
    Array(&'a [Value], &'static [&'static str]),
}

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        match self {
            Fields::Map(entries) => entries
                .iter()
                .find(|(key, _)| key.as_str() == Some(k))
                .map(|(_, v)| v),
            Fields::Array(items, names) => items.get(names.iter().position(|n| *n == k)?),
        }
    }
}

fn event(v: &Value) -> PodEvent {
    let (tag, fields) = match v {
        Value::Map(entries) => {
            let fields = Fields::Map(entries);
            (
                fields.get("type").and_then(Value::as_str).unwrap_or(""),
                fields,
            )
        }
        Value::Array(items) => {
            let tag = items.first().and_then(Value::as_str).unwrap_or("");
            let names: &'static [&'static str] = match tag {
                "BlockStored" => &STORED_FIELDS,
                "BlockRemoved" => &REMOVED_FIELDS,
                _ => &[],
            };
            (
                tag,
                Fields::Array(items.get(1..).unwrap_or_default(), names),
            )
        }
        _ => return PodEvent::Unknown(String::new()),
    };
    let get = |k: &str| fields.get(k);
    let text = |k: &str| get(k).and_then(Value::as_str).map(str::to_owned);
    let int = |k: &str| get(k).and_then(Value::as_i64);
    match tag {
        "BlockStored" => PodEvent::BlockStored(BlockStored {
            block_hashes: get("block_hashes").map(ids).unwrap_or_default(),
            parent: get("parent_block_hash").and_then(id),
            token_ids: get("token_ids")
                .and_then(Value::as_array)
                .map(|t| {
                    t.iter()
                        .map(|t| t.as_u64().map_or(u32::MAX, |t| t as u32))
                        .collect()
                })
                .unwrap_or_default(),
            block_size: int("block_size").map_or(0, |b| b.clamp(0, i64::from(u32::MAX)) as u32),
            lora_id: int("lora_id"),
            lora_name: text("lora_name"),
            cache_salt: get("metadata")
                .or_else(|| get("lora_name").filter(|v| v.is_map()))
                .and_then(|m| Fields::Map(m.as_map()?).get("cache_salt"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            medium: text("medium"),
            extra_keys: get("extra_keys")
                .and_then(Value::as_array)
                .map(|per_block| {
                    per_block
                        .iter()
                        .map(|keys| keys.as_array().map(|keys| keys.iter().map(extra).collect()))
                        .collect()
                }),
            group_idx: int("group_idx"),
        }),
        "BlockRemoved" => PodEvent::BlockRemoved {
            block_hashes: get("block_hashes").map(ids).unwrap_or_default(),
            medium: text("medium"),
            group_idx: int("group_idx"),
        },
        "AllBlocksCleared" => PodEvent::AllBlocksCleared,
        other => PodEvent::Unknown(other.to_owned()),
    }
}

fn id(v: &Value) -> Option<PodBlockId> {
    match v {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|i| i as u64))
            .map(PodBlockId),
        Value::Binary(b) => Some(PodBlockId::from_bytes(b)),
        _ => None,
    }
}

fn ids(v: &Value) -> Vec<PodBlockId> {
    v.as_array()
        .map(|a| a.iter().filter_map(id).collect())
        .unwrap_or_default()
}

fn extra(v: &Value) -> ExtraKey {
    match v.as_str() {
        Some(s) => ExtraKey::Text(s.to_owned()),
        None => ExtraKey::Other,
    }
}

fn to_value(e: &PodEvent, form: Form) -> Value {
    let opt_text = |s: &Option<String>| s.as_deref().map_or(Value::Nil, Value::from);
    let opt_int = |i: Option<i64>| i.map_or(Value::Nil, Value::from);
    let id_values =
        |ids: &[PodBlockId]| Value::Array(ids.iter().map(|h| Value::from(h.0)).collect());
    let (tag, fields): (&str, Vec<(&str, Value)>) = match e {
        PodEvent::BlockStored(s) => (
            "BlockStored",
            vec![
                ("block_hashes", id_values(&s.block_hashes)),
                (
                    "parent_block_hash",
                    s.parent.map_or(Value::Nil, |p| Value::from(p.0)),
                ),
                (
                    "token_ids",
                    Value::Array(s.token_ids.iter().map(|&t| Value::from(t)).collect()),
                ),
                ("block_size", Value::from(s.block_size)),
                ("lora_id", opt_int(s.lora_id)),
                ("medium", opt_text(&s.medium)),
                ("lora_name", opt_text(&s.lora_name)),
                (
                    "extra_keys",
                    s.extra_keys.as_ref().map_or(Value::Nil, |per_block| {
                        Value::Array(
                            per_block
                                .iter()
                                .map(|keys| {
                                    keys.as_ref().map_or(Value::Nil, |keys| {
                                        Value::Array(
                                            keys.iter()
                                                .map(|k| match k {
                                                    ExtraKey::Text(s) => Value::from(s.as_str()),
                                                    ExtraKey::Other => Value::Array(vec![
                                                        Value::from("mm"),
                                                        Value::from(0),
                                                    ]),
                                                })
                                                .collect(),
                                        )
                                    })
                                })
                                .collect(),
                        )
                    }),
                ),
                ("group_idx", opt_int(s.group_idx)),
            ]
            .into_iter()
            .chain(s.cache_salt.as_deref().map(|salt| {
                (
                    "metadata",
                    Value::Map(vec![(Value::from("cache_salt"), Value::from(salt))]),
                )
            }))
            .collect(),
        ),
        PodEvent::BlockRemoved {
            block_hashes,
            medium,
            group_idx,
        } => (
            "BlockRemoved",
            vec![
                ("block_hashes", id_values(block_hashes)),
                ("medium", opt_text(medium)),
                ("group_idx", opt_int(*group_idx)),
            ],
        ),
        PodEvent::AllBlocksCleared => ("AllBlocksCleared", Vec::new()),
        PodEvent::Unknown(tag) => (tag.as_str(), Vec::new()),
    };
    match form {
        Form::Map => Value::Map(
            std::iter::once((Value::from("type"), Value::from(tag)))
                .chain(fields.into_iter().map(|(k, v)| (Value::from(k), v)))
                .collect(),
        ),
        Form::Array => Value::Array(
            std::iter::once(Value::from(tag))
                .chain(fields.into_iter().map(|(_, v)| v))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Message {
        Message {
            topic: b"kv".to_vec(),
            seq: 41,
            ts: 1.5,
            events: vec![
                PodEvent::BlockStored(BlockStored {
                    block_hashes: vec![PodBlockId(7), PodBlockId(u64::MAX)],
                    parent: Some(PodBlockId(3)),
                    token_ids: (0..8).collect(),
                    block_size: 4,
                    lora_id: Some(2),
                    lora_name: Some("sql".into()),
                    medium: Some("GPU".into()),
                    extra_keys: Some(vec![
                        Some(vec![ExtraKey::Text("sql".into()), ExtraKey::Other]),
                        None,
                    ]),
                    group_idx: Some(0),
                    cache_salt: Some("tenant-a".into()),
                }),
                PodEvent::BlockRemoved {
                    block_hashes: vec![PodBlockId(9)],
                    medium: None,
                    group_idx: None,
                },
                PodEvent::AllBlocksCleared,
            ],
            data_parallel_rank: Some(0),
        }
    }

    #[test]
    fn both_forms_round_trip() {
        for form in [Form::Map, Form::Array] {
            let frames = encode(&sample(), form);
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            assert_eq!(decode(&refs), Ok(sample()), "{form:?}");
        }
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        assert_eq!(decode(&[b"kv"]), Err(WireError::Frames(1)));
        assert_eq!(decode(&[b"kv", b"123", b""]), Err(WireError::Sequence(3)));
        assert!(matches!(
            decode(&[b"kv", &[0; 8], b"\x92"]),
            Err(WireError::Decode(_))
        ));
        assert!(matches!(
            decode(&[b"kv", &[0; 8], b"\x01"]),
            Err(WireError::Shape(_))
        ));
        // unknown event types and stray values are kept as Unknown, not errors
        let m = Message {
            events: vec![PodEvent::Unknown("BlockMoved".into())],
            ..sample()
        };
        let frames = encode(&m, Form::Map);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        assert_eq!(decode(&refs).map(|m| m.events), Ok(m.events));
    }

    #[test]
    fn byte_hashes_are_ids_too() {
        let a = id(&Value::Binary(vec![1; 32]));
        assert_eq!(a, Some(PodBlockId::from_bytes(&[1; 32])));
        assert_ne!(a, id(&Value::Binary(vec![2; 32])));
    }
}
