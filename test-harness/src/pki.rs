//! Certificates made for a test with `openssl` (Debian's; setup installs it): a CA, a server
//! certificate for a DNS name and a client certificate, both signed by the CA, as
//! `ca.crt`/`ca.key`, `server.crt`/`server.key`, `client.crt`/`client.key` in one directory.

use anyhow::{bail, Context};
use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("openssl (Debian package openssl; scripts/setup.sh installs it)")?;
    if !out.status.success() {
        bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A CA, a server certificate carrying `server_name` (a DNS SAN) and a client certificate
/// (client auth), all in `dir`, valid for two days.
pub fn certificates(dir: &Path, server_name: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=prefix-router test CA",
    ];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
    openssl(dir, &ca)?;
    for (who, ext) in [
        ("server", format!("subjectAltName=DNS:{server_name}")),
        ("client", "extendedKeyUsage=clientAuth".to_owned()),
    ] {
        std::fs::write(dir.join(format!("{who}.ext")), &ext)?;
        let subj = format!("/CN={who}");
        let (key, csr, crt, ext) = (
            format!("{who}.key"),
            format!("{who}.csr"),
            format!("{who}.crt"),
            format!("{who}.ext"),
        );
        let mut req = vec!["req", "-subj", &subj];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr]);
        openssl(dir, &req)?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
        )?;
    }
    Ok(())
}
