class Symbol: pass
