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
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> anyhow::Result<Proc> {
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
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
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
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A currently free port on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
