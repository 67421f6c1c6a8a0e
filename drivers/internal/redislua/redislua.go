// Package redislua holds the Lua that the Redis and Redlock drivers'
// scripts share.
package redislua

// NextFence defines the Lua function nextFence(), for a script whose
// KEYS[2] is the shared fence counter of its key's slot and KEYS[3] the
// key's legacy per-key counter: it folds the legacy counter into the
// shared one (max) and deletes it, so that no fence goes back after an
// upgrade, then returns the shared counter raised by one (INCR, 64-bit).
// Prepend it to the script's text.
const NextFence = `
local function nextFence()
  local old = redis.call('GET', KEYS[3])
  if old then
    if tonumber(old) > tonumber(redis.call('GET', KEYS[2]) or '0') then
      redis.call('SET', KEYS[2], old)
    end
    redis.call('DEL', KEYS[3])
  end
  return redis.call('INCR', KEYS[2])
end
`
