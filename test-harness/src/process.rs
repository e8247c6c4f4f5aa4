//! Child processes that are always cleaned up, plus readiness polling (never fixed sleeps).

use anyhow::{bail, Context};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) on drop; its output goes to a log file.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Option<Child>,
    /// It leads its own process group, which kill and terminate signal whole (servers that
    /// start workers of their own, as vLLM does).
    group: bool,
}

impl Proc {
    pub fn spawn(name: &str, cmd: Command, log_dir: &Path) -> anyhow::Result<Proc> {
        Self::spawn_in(name, cmd, log_dir, false)
    }

    /// [`Proc::spawn`] in a process group of its own: stopping it stops its children too.
    pub fn spawn_group(name: &str, mut cmd: Command, log_dir: &Path) -> anyhow::Result<Proc> {
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        Self::spawn_in(name, cmd, log_dir, true)
    }

    fn spawn_in(name: &str, mut cmd: Command, log_dir: &Path, group: bool) -> anyhow::Result<Proc> {
        std::fs::create_dir_all(log_dir)?;
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Proc {
            name: name.to_owned(),
            log,
            child: Some(child),
            group,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The tail of its log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGKILL now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.group {
                self.signal_group(&c, "-KILL");
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        if let Some(c) = &self.child {
            if self.group {
                self.signal_group(c, "-TERM");
            } else {
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(c.id().to_string())
                    .status();
            }
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if self.exited().is_some() {
                    self.child = None;
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill();
    }

    fn signal_group(&self, c: &Child, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, "--", &format!("-{}", c.id())])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A currently free port on 127.0.0.1: free when picked, not promised until bound (see
/// [`on_fresh_ports`]).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// How many times [`on_fresh_ports`] starts something.
const PORT_ATTEMPTS: usize = 3;

/// Runs `start`, which picks its ports with [`free_port`] and starts processes on them, again
/// (up to [`PORT_ATTEMPTS`] times in all) when it fails because another process took a port
/// between the pick and the bind. That window is seconds for Envoy, which compiles the filter
/// before it binds its listener, and the tests run side by side opening connections whose
/// ephemeral ports come from the same range; a lost port once failed a fresh CI run (the
/// demo's, which now retries the same way). Any other failure is returned as it is.
pub fn on_fresh_ports<T>(
    what: &str,
    mut start: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let mut attempt = 1;
    loop {
        match start() {
            Err(e) if attempt < PORT_ATTEMPTS && lost_port(&format!("{e:#}")) => {
                eprintln!("{what} lost a port to another process; starting it on fresh ones");
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// Whether a start failed on a port another process holds, by what the servers this
/// harness starts log then (Envoy, Prometheus, the model server; llama.cpp's own words).
fn lost_port(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    error.contains("address already in use") || error.contains("couldn't bind")
}

/// Polls `check` every 20 ms until it returns true, the process dies, or `timeout` passes.
pub fn wait_until(
    what: &str,
    proc_: &mut Proc,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return Ok(());
        }
        if let Some(status) = proc_.exited() {
            bail!(
                "{what}: process exited ({status}); log:\n{}",
                proc_.log_tail()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: not ready after {timeout:?}; log:\n{}",
                proc_.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_port_is_tried_again_on_fresh_ones_and_nothing_else_is() {
        let mut tries = 0;
        let r = on_fresh_ports("envoy", || {
            tries += 1;
            if tries < PORT_ATTEMPTS {
                bail!("envoy: process exited; log:\ncannot bind '127.0.0.1:48033': Address already in use");
            }
            Ok(tries)
        });
        assert_eq!(r.unwrap(), PORT_ATTEMPTS);

        let mut tries = 0;
        let r: anyhow::Result<()> = on_fresh_ports("prometheus", || {
            tries += 1;
            bail!("listen tcp 127.0.0.1:9090: bind: address already in use")
        });
        assert!(r.is_err());
        assert_eq!(
            tries, PORT_ATTEMPTS,
            "gives up after {PORT_ATTEMPTS} starts"
        );

        let mut tries = 0;
        let r: anyhow::Result<()> = on_fresh_ports("pod", || {
            tries += 1;
            bail!("pod: not ready after 60s")
        });
        assert!(r.is_err());
        assert_eq!(tries, 1, "any other failure is not retried");
    }
}
