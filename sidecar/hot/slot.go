package hot

// SlotCount is the number of Redis Cluster hash slots.
const SlotCount = 16384

// crcTable is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the CRC
// Redis Cluster uses to map keys to slots.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(s string) uint16 { return crc16Update(0, s) }

// crc16Update continues the CRC c over s, so a common prefix is hashed once.
func crc16Update(c uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crcTable[byte(c>>8)^s[i]]
	}
	return c
}

// Slot returns the Redis Cluster hash slot of key: CRC16 of the key, or of
// its hash tag (what lies between the first "{" and the next "}", if that is
// not empty), modulo 16384.
func Slot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return int(crc16(key)) % SlotCount
			}
		}
		break
	}
	return int(crc16(key)) % SlotCount
}
