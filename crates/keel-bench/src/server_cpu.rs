//! The CPU time the servers under load spent in the measured window (`--server-pids`): user
//! plus system time of each process and all its threads, from `/proc/PID/stat` (Linux), read
//! as the window starts and as it ends. The servers must run on this machine.

use std::time::Duration;

use crate::driver::Window;

/// Reads the processes' CPU time once now, so that a wrong pid fails before the run.
pub fn check(pids: &[u32]) -> Result<(), String> {
    cpu_time(pids).map(|_| ())
}

/// The CPU time `pids` spend between `window.start` and `window.end`, read at those instants.
pub async fn during(pids: Vec<u32>, window: Window) -> Result<Duration, String> {
    tokio::time::sleep_until(window.start).await;
    let start = cpu_time(&pids)?;
    tokio::time::sleep_until(window.end).await;
    let end = cpu_time(&pids)?;
    Ok(end.saturating_sub(start))
}

/// The user plus system time every process of `pids` has used so far.
fn cpu_time(pids: &[u32]) -> Result<Duration, String> {
    let per_second = ticks_per_second()?;
    let mut ticks = 0u64;
    for pid in pids {
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path)
            .map_err(|error| format!("server pid {pid}: reading {path}: {error}"))?;
        ticks += parse_ticks(&stat)
            .ok_or_else(|| format!("server pid {pid}: {path} has no CPU times"))?;
    }
    Ok(Duration::from_secs_f64(ticks as f64 / per_second as f64))
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command name (field 2)
/// is in parentheses and may hold spaces and parentheses itself, so fields are counted after
/// the last `)`.
fn parse_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The clock ticks per second `/proc` counts in.
fn ticks_per_second() -> Result<u64, String> {
    // SAFETY: sysconf(3) takes an integer and reads no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks)
        .ok()
        .filter(|ticks| *ticks > 0)
        .ok_or_else(|| "this system does not say its clock ticks per second".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_times_are_read_after_the_command_name() {
        let stat =
            "4242 (keel (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 170 30 0 0 20 0 9 0 1 2 3";
        assert_eq!(parse_ticks(stat), Some(200));
        assert_eq!(parse_ticks("4242 (keel) S 1"), None);
    }

    #[test]
    fn this_process_has_a_cpu_time_and_a_missing_one_is_an_error() {
        let own = std::process::id();
        assert!(cpu_time(&[own]).is_ok());
        let error = check(&[u32::MAX]).unwrap_err();
        assert!(
            error.contains(&format!("server pid {}", u32::MAX)),
            "{error}"
        );
    }
}
