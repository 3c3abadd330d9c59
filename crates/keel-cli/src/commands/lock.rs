//! `keel lock acquire|renew|release|inspect`: durations checked against the limits with the
//! cluster's messages before anything is sent, then one keel-client call each.

use std::time::Duration;

use keel_client::{AcquireOptions, Client};
use keel_types::{KvError, validate};

use crate::args::{LockCommand, bytes};
use crate::output::{self, Output, Report};

pub async fn run(client: &Client, command: LockCommand, out: Output) -> Result<Report, KvError> {
    match command {
        LockCommand::Acquire {
            name,
            ttl,
            wait,
            owner,
            lock_delay,
        } => {
            let name = bytes(&name);
            let ms = Duration::from_millis;
            let options = AcquireOptions {
                owner: owner.as_ref().map(bytes),
                ttl: ms(validate::check_lock_ttl_ms(&name, ttl)?),
                wait: ms(validate::check_lock_wait_ms(&name, wait)?),
                lock_delay: ms(validate::check_lock_delay_ms(&name, lock_delay)?),
            };
            let result = client.acquire(&name, options).await?;
            Ok(output::lock::acquire(&name, &result, out))
        }
        LockCommand::Renew { name, token, ttl } => {
            let name = bytes(&name);
            let ttl = Duration::from_millis(validate::check_lock_ttl_ms(&name, ttl)?);
            let result = client.renew(&name, token, ttl).await?;
            Ok(output::lock::renew(&result, out))
        }
        LockCommand::Release { name, token } => {
            let result = client.release(&bytes(&name), token).await?;
            Ok(output::lock::release(&result, out))
        }
        LockCommand::Inspect { name, consistency } => {
            let name = bytes(&name);
            let result = client.inspect(&name, consistency.into()).await?;
            Ok(output::lock::inspect(&name, &result, out))
        }
    }
}
