-- redis_stats common: the helpers several scripts share. The loader (_scripts/__init__.py,
-- load_script) puts this file in front of flush.lua and gc.lua, so each is still one source with
-- one SHA; it is not a script of its own.

-- The lines of a chunk's text (schema 2, docs/key-schema.md): one series or value per line.
local function lines(text)
  local out = {}
  if text == '' then return out end
  for line in string.gmatch(text .. '\n', '([^\n]*)\n') do out[#out + 1] = line end
  return out
end

-- One component of a hash field, escaped as redis_stats/_core/fields.py does ("\" -> "\\",
-- "|" -> "\/", newline -> "\n"); tests/test_scripts_lua.py checks that both agree.
local function escape(component)
  return (string.gsub(component, '[\\|\n]', {['\\'] = '\\\\', ['|'] = '\\/', ['\n'] = '\\n'}))
end


-- unpack is a global in Lua 5.1 (Redis, Valkey) and table.unpack from 5.2 on: the same name in both.
local unpack = table.unpack or unpack
