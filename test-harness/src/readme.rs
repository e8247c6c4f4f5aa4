//! The README's command blocks, read back so tests run them exactly as written: each shell
//! block follows a `<!-- howto: NAME -->` line, and a test runs [`howto`]`("NAME")` (or CI's
//! `scripts/test.sh` holds its lines). The README cannot drift from what works.

use crate::paths;

/// One fenced block of the README: its name (from the marker before it, if any), language
/// and text, and the line its fence opens on.
#[derive(Debug, Clone)]
pub struct Block {
    pub name: Option<String>,
    pub lang: String,
    pub text: String,
    pub line: usize,
}

const MARKER: &str = "<!-- howto: ";

/// Every fenced block of `markdown`, in order.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = markdown.lines().enumerate().peekable();
    let mut name = None;
    while let Some((i, line)) = lines.next() {
        if let Some(rest) = line.strip_prefix(MARKER) {
            name = rest.strip_suffix(" -->").map(str::to_owned);
            continue;
        }
        let Some(lang) = line.strip_prefix("```") else {
            if !line.trim().is_empty() {
                name = None; // a marker names only the block right after it
            }
            continue;
        };
        let mut text = String::new();
        for (_, l) in lines.by_ref() {
            if l.starts_with("```") {
                break;
            }
            text.push_str(l);
            text.push('\n');
        }
        out.push(Block {
            name: name.take(),
            lang: lang.trim().to_owned(),
            text,
            line: i + 1,
        });
    }
    out
}

/// The README's text.
pub fn readme() -> String {
    std::fs::read_to_string(paths::repo_root().join("README.md")).unwrap_or_default()
}

/// The README block named `name`, exactly as written (empty when there is none: the test
/// running it then fails on an empty script's missing effects, and the checker names it).
pub fn howto(name: &str) -> String {
    blocks(&readme())
        .into_iter()
        .find(|b| b.name.as_deref() == Some(name))
        .map(|b| b.text)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_name_the_next_block_only() {
        let md = "x\n<!-- howto: one -->\n```sh\na\nb\n```\ntext\n```json\n{}\n```\n<!-- howto: two -->\n\n```sh\nc\n```\n";
        let b = blocks(md);
        assert_eq!(b.len(), 3);
        assert_eq!(
            (b[0].name.as_deref(), b[0].text.as_str(), b[0].line),
            (Some("one"), "a\nb\n", 3)
        );
        assert_eq!((b[1].name.as_deref(), b[1].lang.as_str()), (None, "json"));
        assert_eq!(
            (b[2].name.as_deref(), b[2].text.as_str()),
            (Some("two"), "c\n")
        );
    }
}
