//! What hostile (or careless) clients send: bodies up to the 4 MiB limit built to cost a
//! tokenizer or a parser the most (one long word, many short words, deep nesting, huge
//! batches), requests asking for unbounded work (`max_tokens` in the billions), and malformed
//! input. The real-process tests (`tests/hostile.rs`) send each through Envoy and to a pod
//! and check the answer; the bench times them.

use serde_json::json;

/// What a case must be answered with, by the gateway and the pod alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// 200: a request the pod serves, however costly to read.
    Ok,
    /// An OpenAI-style JSON 4xx.
    ClientError,
}

/// One hostile request.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    pub path: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, &'static str)>,
    pub expect: Expect,
}

/// Letters from a seeded xorshift: one word no cache has seen.
fn random_letters(n: usize, seed: u64) -> String {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// Every case, for pods serving SmolLM2 with the default 8192-token context and the default
/// 4 MiB body limit.
pub fn cases() -> Vec<Case> {
    const MIB: usize = 1 << 20;
    let completion = |prompt: serde_json::Value| json!({"prompt": prompt, "max_tokens": 1});
    let case = |name, path, body: serde_json::Value, expect| Case {
        name,
        path,
        body: body.to_string().into_bytes(),
        headers: Vec::new(),
        expect,
    };
    let nested = |depth: usize| {
        format!(
            r#"{{"prompt": {}"x"{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    let mut cases = vec![
        case(
            "one 16 KiB word (4096 tokens)",
            "/v1/completions",
            completion(json!("a".repeat(16 << 10))),
            Expect::Ok,
        ),
        case(
            "one 64 KiB word",
            "/v1/completions",
            completion(json!("a".repeat(64 << 10))),
            Expect::ClientError,
        ),
        case(
            "one 256 KiB word",
            "/v1/completions",
            completion(json!("a".repeat(256 << 10))),
            Expect::ClientError,
        ),
        case(
            "one 1 MiB word of random letters",
            "/v1/completions",
            completion(json!(random_letters(MIB, 7))),
            Expect::ClientError,
        ),
        case(
            "one 3.9 MiB word",
            "/v1/completions",
            completion(json!("b".repeat(4 * MIB - 4096))),
            Expect::ClientError,
        ),
        case(
            "a chat message of one 1 MiB word",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "c".repeat(MIB)}], "max_tokens": 1}),
            Expect::ClientError,
        ),
        case(
            "2 MiB of one-letter words",
            "/v1/completions",
            completion(json!("a ".repeat(MIB))),
            Expect::ClientError,
        ),
        case(
            "a batch of 200,000 one-letter prompts",
            "/v1/completions",
            completion(json!(vec!["a"; 200_000])),
            Expect::ClientError,
        ),
        case(
            "a batch of 200 short prompts",
            "/v1/completions",
            completion(json!(vec!["a short prompt"; 200])),
            Expect::Ok,
        ),
        case(
            "100,000 token ids",
            "/v1/completions",
            completion(json!(vec![42u32; 100_000])),
            Expect::ClientError,
        ),
        case(
            "max_tokens 4,000,000,000",
            "/v1/completions",
            json!({"prompt": "hello", "max_tokens": 4_000_000_000u64}),
            Expect::ClientError,
        ),
        case(
            "chat max_completion_tokens 4,000,000,000",
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4_000_000_000u64}),
            Expect::ClientError,
        ),
        case(
            "max_tokens just over the context",
            "/v1/completions",
            json!({"prompt": "hello", "max_tokens": 8192}),
            Expect::ClientError,
        ),
    ];
    for (name, body) in [
        ("a prompt nested 100,000 arrays deep", nested(100_000)),
        (
            "an unknown field nested 100,000 objects deep",
            format!(
                r#"{{"prompt": "x", "extra": {}1{}}}"#,
                r#"{"a":"#.repeat(100_000),
                "}".repeat(100_000)
            ),
        ),
        (
            "a truncated body",
            String::from("{\"prompt\": \"\u{fffd}\""),
        ),
    ] {
        cases.push(Case {
            name,
            path: "/v1/completions",
            body: body.into_bytes(),
            headers: Vec::new(),
            expect: Expect::ClientError,
        });
    }
    // bytes that are not UTF-8 at all, and a body over the 4 MiB limit
    cases.push(Case {
        name: "invalid UTF-8 bytes",
        path: "/v1/completions",
        body: b"{\"prompt\": \"\xff\xfe\xfd\"}".to_vec(),
        headers: Vec::new(),
        expect: Expect::ClientError,
    });
    cases.push(Case {
        name: "a body over 4 MiB",
        path: "/v1/completions",
        body: completion(json!("d".repeat(4 * MIB + 1)))
            .to_string()
            .into_bytes(),
        headers: Vec::new(),
        expect: Expect::ClientError,
    });
    cases
}
