package org.evaluestore;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;

/**
 * EVJ1 records (docs/JAVA.md section 5): one {@code EValue[]} as bytes a desktop tool packs
 * into an evalue_store container ({@code evalue-store pack DIR -o data.evs}).
 *
 * <p>In an app, frame what ExecuTorch's {@code EValue.toByteArray()} returns:
 * {@code Evj1.frame(new byte[][] {x.toByteArray(), y.toByteArray()})}. The static
 * serializers below write the same bytes as {@code toByteArray()} (docs/JAVA.md section 2),
 * for code that has no ExecuTorch classes at hand (tools, tests). Everything is big-endian.
 */
public final class Evj1 {
  public static final int MAGIC = 0x45564A31; // "EVJ1"

  private Evj1() {}

  /** One EVJ1 record from serialized EValues (each an {@code EValue.toByteArray()}). */
  public static byte[] frame(byte[][] values) {
    long size = 8;
    for (byte[] value : values) {
      if (value.length < 1) throw new IllegalArgumentException("an EValue is at least 1 byte");
      size += 4L + value.length;
    }
    if (size > Integer.MAX_VALUE - 8) throw new IllegalArgumentException("record too large");
    ByteBuffer out = ByteBuffer.allocate((int) size); // big-endian by default
    out.putInt(MAGIC).putInt(values.length);
    for (byte[] value : values) out.putInt(value.length).put(value);
    return out.array();
  }

  public static byte[] none() {
    return new byte[] {0};
  }

  public static byte[] bool(boolean value) {
    return new byte[] {5, (byte) (value ? 1 : 0)};
  }

  public static byte[] int64(long value) {
    return ByteBuffer.allocate(9).put((byte) 4).putLong(value).array();
  }

  public static byte[] float64(double value) {
    return ByteBuffer.allocate(9).put((byte) 3).putDouble(value).array();
  }

  /** A String; one that is not valid Unicode (a lone surrogate) is refused, where
   * {@code getBytes} would write {@code ?} for it (docs/JAVA.md section 3). */
  public static byte[] string(String value) {
    byte[] utf8;
    try {
      ByteBuffer encoded =
          StandardCharsets.UTF_8
              .newEncoder()
              .onMalformedInput(CodingErrorAction.REPORT)
              .onUnmappableCharacter(CodingErrorAction.REPORT)
              .encode(CharBuffer.wrap(value));
      utf8 = new byte[encoded.remaining()];
      encoded.get(utf8);
    } catch (CharacterCodingException e) {
      throw new IllegalArgumentException("a String that is not valid Unicode (a lone surrogate)");
    }
    return ByteBuffer.allocate(5 + utf8.length).put((byte) 2).putInt(utf8.length).put(utf8).array();
  }

  /** A float32 tensor (ScalarType 6) of {@code shape}, elements row-major. */
  public static byte[] tensor(float[] data, long[] shape) {
    ByteBuffer out = tensorHeader(6, shape, 4L * data.length);
    for (float x : data) out.putFloat(x);
    return out.array();
  }

  /** An int64 tensor (ScalarType 4) of {@code shape}, elements row-major. */
  public static byte[] tensor(long[] data, long[] shape) {
    ByteBuffer out = tensorHeader(4, shape, 8L * data.length);
    for (long x : data) out.putLong(x);
    return out.array();
  }

  private static ByteBuffer tensorHeader(int dtype, long[] shape, long dataBytes) {
    if (shape.length > 64) throw new IllegalArgumentException("rank above 64");
    long itemsize = dtype == 6 ? 4 : 8;
    long numel = 1;
    long bound = itemsize; // itemsize x prod(max(dim, 1)): the size rule, docs/JAVA.md section 2
    for (long dim : shape) {
      if (dim < 0 || dim > Integer.MAX_VALUE) throw new IllegalArgumentException("bad dim");
      try {
        bound = Math.multiplyExact(bound, Math.max(dim, 1));
      } catch (ArithmeticException e) {
        throw new IllegalArgumentException("shape past the size rule (2^63 bytes)");
      }
      numel *= dim; // at most bound: no overflow
    }
    if (numel * itemsize != dataBytes) throw new IllegalArgumentException("data != shape");
    ByteBuffer out = ByteBuffer.allocate((int) (3 + 4L * shape.length + dataBytes));
    out.put((byte) 1).put((byte) dtype).put((byte) shape.length);
    for (long dim : shape) out.putInt((int) dim);
    return out;
  }

  /** Writes N XOR training records, as an app collects them, to DIR/000000.bin ...: each
   * [x float32 [1, 2], y int64 [1], note String, weight Double, seen Bool, id Int, None]. */
  public static void main(String[] args) throws Exception {
    java.io.File dir = new java.io.File(args[0]);
    int n = Integer.parseInt(args[1]);
    dir.mkdirs();
    for (int i = 0; i < n; i++) {
      int a = (i >> 1) & 1, b = i & 1;
      byte[] record =
          frame(
              new byte[][] {
                tensor(new float[] {a, b}, new long[] {1, 2}),
                tensor(new long[] {a ^ b}, new long[] {1}),
                string("sample " + i + " é😀"),
                float64(0.25 * i),
                bool(i % 3 == 0),
                int64(-1L - i),
                none()
              });
      try (java.io.FileOutputStream f =
          new java.io.FileOutputStream(new java.io.File(dir, String.format("%06d.bin", i)))) {
        f.write(record);
      }
    }
  }
}
