//! Where the filter's .wasm is when the command line does not name it, so the installed tool
//! works outside a checkout: `$PREFIX_ROUTER_WASM`; then the install location
//! (`$XDG_DATA_HOME/prefix-router/`, by default `~/.local/share/prefix-router/`, where
//! `scripts/install.sh` copies it); then the build of the checkout this tool was built in.
//! Likewise the default model's tokenizer directory (the .wasm carries no vocabulary): under
//! `$PREFIX_ROUTER_DATA/models/`, the install location's `models/`, or the checkout's `data/`.

use std::path::{Path, PathBuf};

/// The filter's file name.
pub const WASM_NAME: &str = "prefix_router_filter.wasm";

/// The install location's directory for this environment (`None` without a home).
pub fn data_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let base = match env("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env("HOME")?).join(".local/share"),
    };
    Some(base.join("prefix-router"))
}

/// The .wasm to load: the first of the places above that holds one, or an error naming
/// every place looked at.
pub fn default_wasm(env: impl Fn(&str) -> Option<String>) -> anyhow::Result<PathBuf> {
    let mut looked = Vec::new();
    if let Some(p) = env("PREFIX_ROUTER_WASM").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    looked.push("$PREFIX_ROUTER_WASM".to_owned());
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/wasm32-wasip1/wasm")
        .join(WASM_NAME);
    for candidate in data_dir(&env)
        .map(|d| d.join(WASM_NAME))
        .into_iter()
        .chain([built])
    {
        if candidate.is_file() {
            return Ok(candidate.canonicalize().unwrap_or(candidate));
        }
        looked.push(candidate.display().to_string());
    }
    anyhow::bail!(
        "no filter .wasm found (looked at {}); pass --wasm, or install it with scripts/install.sh",
        looked.join(", ")
    )
}

/// The tokenizer directory of the default model ([`defaults::MODEL_NAME`], what
/// `scripts/setup.sh` installs), for a command line that names neither a model nor a
/// directory: the first of the places above holding its `tokenizer.json`, or an error naming
/// every place looked at.
pub fn default_tokenizer_dir(env: impl Fn(&str) -> Option<String>) -> anyhow::Result<PathBuf> {
    use prefix_core::protocol::defaults;
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data");
    let candidates = env(defaults::DATA_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .chain(data_dir(&env))
        .chain([checkout])
        .map(|d| defaults::model_dir(&d));
    let mut looked = Vec::new();
    for dir in candidates {
        if dir.join("tokenizer.json").is_file() {
            return Ok(dir.canonicalize().unwrap_or(dir));
        }
        looked.push(dir.display().to_string());
    }
    anyhow::bail!(
        "no tokenizer for the default model {} found (looked at {}); pass --tokenizer-dir with the model's Hugging Face directory (the filter carries no vocabulary)",
        defaults::MODEL_NAME,
        looked.join(", ")
    )
}

/// The tokenizer directory of a model none was given for: none without the filter; the
/// installed one for the default model; for any other, an error naming `flag`.
pub fn tokenizer_dir_for(filter: bool, model: &str, flag: &str) -> anyhow::Result<Option<PathBuf>> {
    if !filter {
        return Ok(None);
    }
    if model != prefix_core::protocol::defaults::MODEL_NAME {
        anyhow::bail!(
            "{flag} is required for model '{model}': the filter carries no vocabulary and fetches the model's tokenizer.json (from a Hugging Face model directory) at start"
        );
    }
    default_tokenizer_dir(|k| std::env::var(k).ok()).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_location_follows_xdg() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            data_dir(env(&[("HOME", "/home/u")])),
            Some(PathBuf::from("/home/u/.local/share/prefix-router"))
        );
        assert_eq!(
            data_dir(env(&[("HOME", "/home/u"), ("XDG_DATA_HOME", "/data")])),
            Some(PathBuf::from("/data/prefix-router"))
        );
        assert_eq!(
            default_wasm(env(&[("PREFIX_ROUTER_WASM", "/x.wasm")])).unwrap(),
            PathBuf::from("/x.wasm")
        );
    }

    #[test]
    fn the_default_tokenizer_is_looked_for_in_each_data_directory() {
        let root = std::env::temp_dir().join(format!("prefix-router-tok-{}", std::process::id()));
        let dir = prefix_core::protocol::defaults::model_dir(&root.join("prefix-router"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        let xdg = root.display().to_string();
        let env = |k: &str| match k {
            "XDG_DATA_HOME" => Some(xdg.clone()),
            "PREFIX_ROUTER_DATA" => Some("/nowhere".to_owned()),
            _ => None,
        };
        assert_eq!(
            default_tokenizer_dir(env).unwrap(),
            dir.canonicalize().unwrap(),
            "the install location, after an empty $PREFIX_ROUTER_DATA"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
